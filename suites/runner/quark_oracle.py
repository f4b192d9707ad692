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


def mx_scale_bytes(w, block_size: int = 32):
    """The E8M0 scale byte of each `block_size`-wide block along w's last dim, as AMD Quark's MX emulation
    (`fake_quantize_mx`, mode "even") computes the block's scale (its `even_round` of the block amax), as
    log2(scale) + 127 (float32 powers of two). A block of zeros gets fp32's eps from Quark, which is no E8M0 byte:
    ValueError, so callers see such a block instead of a wrong byte. Skips when amd-quark is not installed."""
    import torch

    _own_extensions_folder()
    module = pytest.importorskip("quark.torch.kernel.hw_emulation.hw_emulation_interface")
    amax = w.detach().to(torch.float32).unflatten(-1, (-1, block_size)).abs().amax(-1)
    if not (amax > 0).all():
        raise ValueError("w: a block of zeros has no E8M0 scale in Quark's emulation (its scale is fp32 eps)")
    scale = module.even_round(amax.clone(), module.Dtype("fp4"))  # even_round works in place on a float32 amax
    return (torch.log2(scale) + 127).to(torch.uint8)


def quark_torch():
    """`quark.torch` (its ModelQuantizer and export_safetensors; skips when amd-quark is not installed)."""
    _own_extensions_folder()
    return pytest.importorskip("quark.torch")
