"""AMD Quark's MX emulation, imported for the suites as an oracle.

Quark JIT-compiles a C++ extension on first import, under torch's extension lock. A run killed while compiling
leaves that lock behind, and every later import in the same extensions folder waits on it forever. So each test
run compiles into a folder of its own (shared by its xdist workers through PYTEST_XDIST_TESTRUNUID): a killed
run's lock dies with its folder."""

from __future__ import annotations

import os
import pathlib
import tempfile

import pytest


def _own_extensions_folder() -> None:
    if "TORCH_EXTENSIONS_DIR" not in os.environ:
        run = os.environ.get("PYTEST_XDIST_TESTRUNUID") or str(os.getpid())
        folder = pathlib.Path(tempfile.gettempdir()) / f"touchstone-torch-extensions-{run}"
        folder.mkdir(exist_ok=True)
        os.environ["TORCH_EXTENSIONS_DIR"] = str(folder)


def fake_quantize_mx():
    """Quark's `fake_quantize_mx` (skips when amd-quark is not installed)."""
    _own_extensions_folder()
    module = pytest.importorskip("quark.torch.kernel.hw_emulation.hw_emulation_interface")
    return module.fake_quantize_mx


def quark_torch():
    """`quark.torch` (its ModelQuantizer and export_safetensors; skips when amd-quark is not installed)."""
    _own_extensions_folder()
    return pytest.importorskip("quark.torch")
