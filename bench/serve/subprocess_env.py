"""The environment of a `touchstone serve` subprocess (the serving bench's and the server suites'), importable
without the serve extra (the suites' conftest needs it before it knows whether the extra is installed)."""

from __future__ import annotations

import os
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]


def server_env(**extra: str) -> dict[str, str]:
    """The environment of a `touchstone serve` subprocess: this one, with the repository root put in front of
    PYTHONPATH (the caller's entries kept: on an image without the serve extra its packages may come from a
    PYTHONPATH directory) and the Triton interpreter switch removed (the server never runs interpreted)."""
    env = dict(os.environ, **extra)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env.pop("TRITON_INTERPRET", None)
    return env
