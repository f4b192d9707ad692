"""Block-FP8 linear (`kernels.block_fp8_linear`: x quantized per 1x128 group inside the GEMM): the same bytes as
the two-kernel path (`kernels.fp8_quant.quantize_fp8` then `kernels.block_fp8_gemm`) at every launch shape the
interpreter can afford, and the mirror (`reference.gemm.block_fp8_linear`) within the GEMM's tolerance row;
named cases (a zero group, a NaN, a group past fp8's range); bad arguments named; opcheck; negative controls:
a planted weight-scale bug in the fused kernel must fail both checks."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kernels.tolerances import assert_lossy, families
from reference.gemm import block_fp8_linear as ref
from reference.quant import fp8 as quant
from suites import oracles

kernel = pytest.importorskip("kernels.block_fp8_linear")
gemm = pytest.importorskip("kernels.block_fp8_gemm")
fp8_quant = pytest.importorskip("kernels.fp8_quant")
FAMILY = families.BLOCK_FP8_GEMM
FP8 = torch.float8_e4m3fn
Config = gemm.LaunchConfig
CONFIGS = (
    None,  # the launcher's own choice
    Config(block_m=16, block_n=128, group_m=1, split_k=2, num_warps=4, num_stages=1),
    Config(block_m=32, block_n=64, group_m=2, split_k=1, num_warps=4, num_stages=1),
    Config(block_m=16, block_n=256, group_m=1, split_k=1, num_warps=4, num_stages=1),
)


def operands(m: int, n: int, k: int, seed: int, dtype=torch.bfloat16, spread: float = 6.0):
    """x [M, K] in `dtype` with a power-of-two magnitude per 128-group, block-FP8 weights, the fp64 product of
    the unquantized operands."""
    g = torch.Generator().manual_seed(seed)
    mag = torch.exp2(torch.empty(m, k // 128).uniform_(-spread, spread, generator=g)).repeat_interleave(128, 1)
    x = (torch.randn(m, k, generator=g) * mag).to(dtype)
    w = torch.randn(n, k, generator=g) / k**0.5
    b, b_scales = quant.quantize_fp8_blocks(w, block=128)
    return (x, b, b_scales), oracles.unquantized_product(x.float(), w)


def two_kernels(x, b, b_scales, out_dtype, config=None):
    a, a_scales = fp8_quant.quantize_fp8(x, granularity="group", group_size=128)
    return gemm.launch_block_fp8_gemm(a, a_scales, b, b_scales, out_dtype=out_dtype, config=config)


def same_bytes(got: torch.Tensor, want: torch.Tensor) -> bool:
    return torch.equal(got.cpu().view(torch.uint8), want.cpu().view(torch.uint8))


@given(
    m=st.integers(1, 40),
    n=st.integers(17, 300),
    k_blocks=st.integers(1, 3),
    seed=st.integers(0, 2**31 - 1),
    dtype=st.sampled_from([torch.bfloat16, torch.float16]),
    out_dtype=st.sampled_from([torch.bfloat16, torch.float32]),
    config=st.sampled_from(CONFIGS),
)
def test_fused_equals_two_kernels_and_the_mirror(m, n, k_blocks, seed, dtype, out_dtype, config, device):
    (x, b, b_scales), ideal = operands(m, n, 128 * k_blocks, seed, dtype)
    args = tuple(t.to(device) for t in (x, b, b_scales))
    if config is None:
        got = kernel.block_fp8_linear(*args, out_dtype=out_dtype)
    else:
        got = kernel.launch_block_fp8_linear(*args, out_dtype=out_dtype, config=config)
    assert same_bytes(got, two_kernels(*args, out_dtype, config))
    assert_lossy(FAMILY, got.cpu(), ref.block_fp8_linear_mirror(x, b, b_scales, out_dtype), ideal)


def named(device: str, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    b = torch.ones(128, x.shape[1]).to(FP8)
    b_scales = torch.ones(1, x.shape[1] // 128)
    got = kernel.block_fp8_linear(x.to(device), b.to(device), b_scales.to(device), torch.float32).cpu()
    return got, ref.block_fp8_linear_mirror(x, b, b_scales, torch.float32)


def test_zero_group_gives_zero_and_a_nan_poisons_its_row(device):
    x = torch.zeros(3, 256, dtype=torch.bfloat16)
    x[1, 5] = float("nan")
    x[2, :] = 2.0  # every weight 1: each output is 256 * 2 exactly (codes 448 at scale 2 / 448)
    got, want = named(device, x)
    assert torch.equal(got[0], torch.zeros(128))
    assert got[1].isnan().all() and want[1].isnan().all()
    assert torch.equal(got[2], torch.full((128,), 512.0)) and torch.equal(want[2], got[2])


def test_group_beyond_fp8_range_is_scaled_not_saturated(device):
    """x = 60000 (past e4m3's 448): the group's scale takes it to code 448, so the product keeps its size."""
    x = torch.full((1, 128), 60000.0, dtype=torch.float16)
    got, want = named(device, x)
    assert torch.equal(got, want) and torch.equal(got, torch.full((1, 128), 60000.0 * 128))


# opcheck's test_schema compares inputs with float arithmetic torch lacks for float8_e4m3fn: the bytes are
# compared here instead.
OPCHECK_UTILS = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


def test_opcheck(device):
    args = tuple(t.to(device) for t in operands(5, 130, 256, seed=3)[0])
    before = [t.clone() for t in args]
    torch.library.opcheck(
        torch.ops.touchstone.block_fp8_linear.default, (*args, torch.bfloat16), test_utils=OPCHECK_UTILS
    )
    for name, old, new in zip(("x", "b", "b_scales"), before, args, strict=True):
        assert same_bytes(old, new), f"{name} was mutated"


def _bad(**change):
    args = dict(
        x=torch.zeros(4, 256, dtype=torch.bfloat16),
        b=torch.zeros(130, 256, dtype=FP8),
        b_scales=torch.ones(2, 2),
        out_dtype=torch.bfloat16,
    )
    args.update(change)
    return args


BAD = [
    (_bad(x=torch.zeros(4, 256, dtype=FP8)), TypeError, "x: dtype"),
    (_bad(b=torch.zeros(130, 256, dtype=torch.bfloat16)), TypeError, "b: dtype"),
    (_bad(b=torch.zeros(130, 128, dtype=FP8)), ValueError, "b: K"),
    (_bad(x=torch.zeros(4, 200, dtype=torch.bfloat16), b=torch.zeros(130, 200, dtype=FP8)), ValueError, "partial K"),
    (_bad(b_scales=torch.ones(1, 2)), ValueError, r"b_scales: shape must be \(2, 2\)"),
    (_bad(out_dtype=torch.int32), TypeError, "out_dtype"),
]


@pytest.mark.parametrize(("args", "error", "message"), BAD, ids=[m for _, _, m in BAD])
def test_bad_arguments(args, error, message, device):
    with pytest.raises(error, match=message):
        ref.block_fp8_linear_mirror(**args)
    moved = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in args.items()}
    with pytest.raises(error, match=message):
        kernel.block_fp8_linear(**moved)


@pytest.mark.parametrize("fault", ["weight_scale_next_k_block", "weight_scale_next_n_block"])
def test_negative_control_planted_bug_is_caught(fault, device):
    (x, b, b_scales), ideal = operands(8, 300, 512, seed=1, spread=2.0)
    # Weight tiles of different sizes, so that a scale read from the wrong tile shows.
    b_scales = b_scales * torch.exp2(torch.arange(b_scales.numel(), dtype=torch.float32).reshape(b_scales.shape) % 5)
    args = tuple(t.to(device) for t in (x, b, b_scales))
    config = Config(block_m=16, block_n=128, group_m=1, num_warps=4, num_stages=1)
    got = kernel.launch_block_fp8_linear(*args, out_dtype=torch.bfloat16, config=config, fault=fault)
    assert not same_bytes(got, two_kernels(*args, torch.bfloat16, config))
    with pytest.raises(AssertionError):
        assert_lossy(FAMILY, got.cpu(), ref.block_fp8_linear_mirror(x, b, b_scales, torch.bfloat16), ideal)
