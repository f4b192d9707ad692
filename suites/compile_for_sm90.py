"""Compile kernels for sm_90 (H100, H200) on a machine with no GPU: Triton's compiler, through ptxas to a cubin, in
a Python process of its own, because under TRITON_INTERPRET=1 (the CPU tier) the jit decorators give interpreter
functions, which the compiler cannot take. A change that breaks a kernel's lowering for Hopper then fails on the
CPU tier, not first on a GPU."""

from __future__ import annotations

import os
import subprocess
import sys


def run_compiler(script: str) -> list[str]:
    """The lines `script` prints, run by this Python without the interpreter; the test fails with its stderr."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout.splitlines()
