"""A `touchstone` command run in a subprocess with its import log (`-X importtime`), to see both what it
printed and how far it got: the user-error tests of `touchstone generate` and `touchstone serve` use it."""

from __future__ import annotations

import subprocess
import sys

import torch

from runner.server.process import ROOT, server_env

# What loading a model imports: an error reported before the load imports none of it.
LOADER = ("gguf", "transformers", "runner.model.llama", "runner.model.gguf_file")


def run_command(module: str, *args: str) -> tuple[subprocess.CompletedProcess, list[str], set[str]]:
    """`python -X importtime -m module args...` -> (the finished process, stderr's lines other than the import
    log, the modules it imported)."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", module, *args],
        cwd=ROOT,
        env=server_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = done.stderr.splitlines()
    imported = {line.split("|")[-1].strip() for line in lines if line.startswith("import time:")}
    return done, [line for line in lines if not line.startswith("import time:")], imported


def heavy(imported: set[str], torch_too: bool = True) -> list[str]:
    """The loader's modules among `imported` (and torch's, unless torch_too is False)."""
    roots = ("torch", *LOADER) if torch_too else LOADER
    return sorted(name for name in imported if name.split(".")[0] in roots or name in LOADER)


def missing_device() -> str:
    """A --device this machine lacks: cuda without a GPU, else one index past the last GPU."""
    return f"cuda:{torch.cuda.device_count()}" if torch.cuda.is_available() else "cuda"
