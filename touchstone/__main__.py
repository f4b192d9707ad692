import sys

from touchstone.cli import main

sys.exit(main())
