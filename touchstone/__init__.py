"""The `touchstone` command: the front door above bench/ and runner/ (see `touchstone.cli`)."""
