"""Bad input to MXFP4, reference and kernel alike: a clear TypeError/ValueError that names the argument."""

from __future__ import annotations

import pytest
import torch

from reference.quant import mxfp4 as ref

kernel = pytest.importorskip("kernels.mxfp4")
IMPLS = {"reference": ref, "kernel": kernel}


@pytest.fixture(params=sorted(IMPLS))
def impl(request, device):
    module = IMPLS[request.param]
    return module, (device if module is kernel else "cpu")


QUANTIZE_ERRORS = [
    (lambda d: (torch.zeros(2, 64, dtype=torch.int32, device=d),), {}, TypeError, "x: dtype"),
    (lambda d: (torch.zeros(2, 48, device=d),), {}, ValueError, "x: last dim must be a multiple of 32"),
    (lambda d: (torch.tensor(1.0, device=d),), {}, ValueError, "x: last dim"),
    (lambda d: (torch.zeros(2, 64, device=d),), {"scale_mode": "nearest"}, ValueError, "scale_mode"),
]


@pytest.mark.parametrize(("args", "kwargs", "error", "message"), QUANTIZE_ERRORS, ids=["dtype", "k", "scalar", "mode"])
def test_quantize_rejects(impl, args, kwargs, error, message):
    module, dev = impl
    with pytest.raises(error, match=message):
        module.quantize_mxfp4(*args(dev), **kwargs)


DEQUANTIZE_ERRORS = [
    (
        lambda d: (torch.zeros(2, 16, dtype=torch.int8, device=d), torch.zeros(2, 1, dtype=torch.uint8, device=d)),
        {},
        TypeError,
        "codes: dtype",
    ),
    (
        lambda d: (torch.zeros(2, 16, dtype=torch.uint8, device=d), torch.zeros(2, 1, device=d)),
        {},
        TypeError,
        "scales: dtype",
    ),
    (
        lambda d: (torch.zeros(2, 16, dtype=torch.uint8, device=d), torch.zeros(2, 2, dtype=torch.uint8, device=d)),
        {},
        ValueError,
        "codes .* and scales .* do not describe one MXFP4 tensor",
    ),
    (
        lambda d: (torch.zeros(2, 16, dtype=torch.uint8, device=d), torch.zeros(3, 1, dtype=torch.uint8, device=d)),
        {},
        ValueError,
        "do not describe one MXFP4 tensor",
    ),
    (
        lambda d: (torch.zeros(2, 16, dtype=torch.uint8, device=d), torch.zeros(2, 1, dtype=torch.uint8, device=d)),
        {"dtype": torch.int32},
        TypeError,
        "dtype must be one of",
    ),
]


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "message"),
    DEQUANTIZE_ERRORS,
    ids=["codes-dtype", "scales-dtype", "k-mismatch", "rows-mismatch", "out-dtype"],
)
def test_dequantize_rejects(impl, args, kwargs, error, message):
    module, dev = impl
    with pytest.raises(error, match=message):
        module.dequantize_mxfp4(*args(dev), **kwargs)


def test_kernel_rejects_non_unit_last_stride(device):
    x = torch.zeros(64, 32, device=device).t()
    with pytest.raises(ValueError, match="x: last dim must have stride 1"):
        kernel.quantize_mxfp4(x)


def test_kernel_rejects_uncollapsible_rows(device):
    x = torch.zeros(4, 6, 64, device=device)[:, :3, :]
    with pytest.raises(ValueError, match=r"x: leading dims .* cannot be viewed as rows"):
        kernel.quantize_mxfp4(x)


def test_kernel_accepts_column_slices_without_copy(device):
    x = torch.randn(4, 256, device=device)
    codes, scales = kernel.quantize_mxfp4(x[:, 64:192])
    want_codes, want_scales = ref.quantize_mxfp4(x[:, 64:192].cpu())
    assert torch.equal(codes.cpu(), want_codes) and torch.equal(scales.cpu(), want_scales)


def test_kernel_rejects_cpu_tensor_outside_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="x: on cpu, but Triton kernels need a GPU tensor"):
        kernel.quantize_mxfp4(torch.zeros(2, 64))


@pytest.mark.gpu_only(reason="needs tensors on two devices")
def test_kernel_rejects_mixed_devices(device):
    codes = torch.zeros(2, 16, dtype=torch.uint8, device=device)
    with pytest.raises(ValueError, match="scales: on cpu, but codes is on"):
        kernel.dequantize_mxfp4(codes, torch.zeros(2, 1, dtype=torch.uint8))


def test_fake_impl_validates_too():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(), pytest.raises(ValueError, match="x: last dim must be a multiple of 32"):
        torch.ops.touchstone.quantize_mxfp4(torch.empty(2, 40), "floor")
