"""The command-line parser of every `touchstone` command: a user error is one line, never a usage dump or a
traceback ("touchstone bench serve: error: argument --concurrency: invalid int value: 'x' (see --help)")."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def fail(prog: str, message: str, status: int = 2) -> NoReturn:
    """Exit with `prog: error: message` on one line (a user error found after parsing: a bad value, no GPU)."""
    print(f"{prog}: error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(status)
