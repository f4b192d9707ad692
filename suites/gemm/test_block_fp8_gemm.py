"""Block-FP8 W8A8 GEMM: the Triton kernel against the precision-mirroring reference (max/RMS relative error)
and the unquantized fp64 product (SQNR), with the one tolerance row per output dtype in kernels.tolerances;
the mirror against the fp64 dequantized product; named cases with exact expected values; the 128x128
weight quantizer; boundaries; negative controls (weight scales read from the neighbouring K or N block)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kernels._packed_ptx import packed_ptx
from kernels.tolerances import assert_exact, assert_lossy, families
from reference.gemm import block_fp8 as ref
from reference.quant import fp8 as quant
from suites import oracles
from suites.guard_bytes import POISON, fill_free_memory

kernel = pytest.importorskip("kernels.block_fp8_gemm")
wgmma_kernel = pytest.importorskip("kernels.block_fp8_gemm_wgmma")
FAMILY = families.BLOCK_FP8_GEMM
FP8 = torch.float8_e4m3fn
Config = kernel.LaunchConfig
# Launch shapes that walk every code path: scalar and per-column weight scales (BLOCK_N <= 128 / 256), split-K
# with its fp32 partials, the persistent loop, tile grouping, the wgmma kernel's two tilings. The interpreter
# affords them all on the small shapes drawn below, the 128x128 tiles included.
CONFIGS = (
    None,  # the launcher's own choice
    Config(block_m=16, block_n=128, group_m=2, split_k=1, num_warps=4, num_stages=1),
    Config(block_m=32, block_n=256, group_m=1, split_k=1, num_warps=4, num_stages=1),
    Config(block_m=16, block_n=64, group_m=4, split_k=3, num_warps=4, num_stages=1),
    Config(block_m=64, block_n=128, group_m=2, split_k=2, persistent=True, num_warps=4, num_stages=1),
    # the wgmma kernel on sm_90 (kernels.block_fp8_gemm_wgmma), its tiled twin elsewhere
    Config(block_m=64, block_n=64, group_m=2, persistent=True, num_warps=4, num_stages=3, wgmma=True),
    kernel.WGMMA_CONFIG,
    Config(block_m=128, block_n=64, group_m=2, persistent=True, warp_specialize=True, num_stages=3, wgmma=True),
)


def make_operands(m: int, n: int, k: int, seed: int, spread: float):
    """Unquantized x [M, K] and w [N, K] (randn times 2**U(-spread, spread) per 128-group / per K block of the
    weight tiles, so block scales differ as in real checkpoints), their block-FP8 quantization and the fp64
    product."""
    g = torch.Generator().manual_seed(seed)
    group_mag = torch.exp2(torch.empty(m, k // 128).uniform_(-spread, spread, generator=g))
    x = torch.randn(m, k, generator=g) * group_mag.repeat_interleave(128, 1)
    # Weight tiles: the full spread along K, at most 2**+-1 between N blocks, so that no single column block
    # dominates the product (an SQNR over one effective output is noise, not a property of the format).
    k_mag = torch.empty(1, k // 128).uniform_(-spread, spread, generator=g)
    tile_mag = torch.exp2(k_mag + torch.empty(-(-n // 128), k // 128).uniform_(-1, 1, generator=g))
    w = torch.randn(n, k, generator=g) * tile_mag.repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)
    # One power of two for the whole product puts its peak near 2**8: in range for every output dtype.
    x = x * 2.0 ** (8 - math.ceil(math.log2(float(oracles.unquantized_product(x, w).abs().max()))))
    a, a_scales = quant.quantize_fp8(x, granularity="group", group_size=128)
    b, b_scales = quant.quantize_fp8_blocks(w, block=128)
    return (a, a_scales, b, b_scales), oracles.unquantized_product(x, w)


def vllm_style_operands(m: int, n: int, k: int, seed: int):
    """vLLM's test data: FP8 codes of U(-448, 448), scales U(0, 1) * 1e-2 per group and per tile."""
    g = torch.Generator().manual_seed(seed)
    a = ((torch.rand(m, k, generator=g) - 0.5) * 896).to(FP8)
    b = ((torch.rand(n, k, generator=g) - 0.5) * 896).to(FP8)
    a_scales = torch.rand(m, k // 128, generator=g) * 1e-2
    b_scales = torch.rand(-(-n // 128), k // 128, generator=g) * 1e-2
    operands = (a, a_scales, b, b_scales)
    return operands, ref.block_fp8_gemm_ideal(*operands)


def on(device: str, operands, column_major_scales: bool = False):
    a, a_scales, b, b_scales = (t.to(device) for t in operands)
    if column_major_scales:  # the layout cuBLAS wants: [M, KB] with stride (1, M)
        a_scales = a_scales.t().contiguous().t()
    return a, a_scales, b, b_scales


def run_kernel(operands, device, out_dtype, config=None, fault="none", column_major_scales=False, gemv=None):
    """The op (table choice), or `config`'s tiled launch, or with `gemv` True the tensor-core GEMV where its PTX
    runs (elsewhere the table's choice)."""
    args = on(device, operands, column_major_scales)
    if gemv and not packed_ptx(args[0].device):
        gemv = None
    if config is None and fault == "none" and gemv is None:
        return kernel.block_fp8_gemm(*args, out_dtype=out_dtype)
    return kernel.launch_block_fp8_gemm(*args, out_dtype=out_dtype, config=config, fault=fault, gemv=gemv)


@given(
    m=st.integers(1, 70),
    n=st.integers(17, 300),
    k_blocks=st.integers(1, 4),
    seed=st.integers(0, 2**31 - 1),
    spread=st.sampled_from([0.0, 4.0, 12.0]),
    out_dtype=st.sampled_from(ref.OUT_DTYPES),
    config=st.sampled_from(CONFIGS),
    column_major=st.booleans(),
    gemv=st.booleans(),
)
def test_kernel_matches_references(m, n, k_blocks, seed, spread, out_dtype, config, column_major, gemv, device):
    """`gemv`: the tensor-core GEMV of `kernels.block_fp8_gemv` at any M (8 rows of A a pass) where it runs."""
    operands, ideal = make_operands(m, n, 128 * k_blocks, seed, spread)
    got = run_kernel(operands, device, out_dtype, None if gemv else config, column_major_scales=column_major, gemv=gemv)
    assert_lossy(FAMILY, got, ref.block_fp8_gemm_mirror(*operands, out_dtype=out_dtype), ideal)


@given(m=st.integers(1, 40), n=st.integers(1, 260), k_blocks=st.integers(1, 6), seed=st.integers(0, 2**31 - 1))
def test_mirror_is_within_fp32_summation_error_of_the_exact_product(m, n, k_blocks, seed):
    """The mirror itself: fp32 sums of exact products, so |mirror - exact| <= gamma_n * sum |terms| with
    n = 128 (in-block sum) + k_blocks (cross-block sum) + 2 (the scale product and the multiply)."""
    operands, _ = vllm_style_operands(m, n, 128 * k_blocks, seed)
    mirror = ref.block_fp8_gemm_mirror(*operands, out_dtype=torch.float32).double()
    a64, b64 = ref.dequantize_operands(*operands)
    exact = a64 @ b64.T
    steps = 128 + k_blocks + 2
    gamma = steps * 2.0**-24 / (1 - steps * 2.0**-24)
    bound = gamma * (a64.abs() @ b64.abs().T)
    assert ((mirror - exact).abs() <= bound).all()
    assert torch.equal(exact, ref.block_fp8_gemm_ideal(*operands))


def test_tiny_and_empty_shapes(device):
    operands, ideal = make_operands(1, 1, 128, seed=5, spread=0.0)
    got = run_kernel(operands, device, torch.float32)
    assert_lossy(FAMILY, got, ref.block_fp8_gemm_mirror(*operands, out_dtype=torch.float32), ideal, "1x1x128")
    empty = (torch.zeros(0, 128, dtype=FP8), torch.zeros(0, 1), torch.zeros(3, 128, dtype=FP8), torch.ones(1, 1))
    assert run_kernel(empty, device, torch.bfloat16).shape == (0, 3)


# ---- named cases: operands built from codes and scales whose product is exact in every output dtype ----
def const_operands(m, n, k, a_code=1.0, b_code=1.0):
    return torch.full((m, k), a_code).to(FP8), torch.full((n, k), b_code).to(FP8)


def case_scale_per_k_block():
    """K = 256: C = 128 * 1 * 1 * (1 * 1) + 128 * 1 * 1 * (2 * 4) = 1152 (the scale of K block 1 differs)."""
    a, b = const_operands(3, 20, 256)
    a_scales = torch.tensor([[1.0, 2.0]]).repeat(3, 1)
    b_scales = torch.tensor([[1.0, 4.0]])
    return (a, a_scales, b, b_scales), torch.full((3, 20), 1152.0)


def case_n_not_a_multiple_of_128():
    """N = 130: columns 0..127 use weight block 0 (scale 0.5), columns 128..129 block 1 (scale 8)."""
    a, b = const_operands(2, 130, 128, a_code=2.0, b_code=-0.5)
    operands = (a, torch.full((2, 1), 0.25), b, torch.tensor([[0.5], [8.0]]))
    want = torch.full((2, 130), 128 * 2.0 * -0.5 * 0.25 * 0.5)
    want[:, 128:] = 128 * 2.0 * -0.5 * 0.25 * 8.0
    return operands, want


def case_nan_code_poisons_its_row():
    """a[1, 200] = 0x7F (NaN in e4m3fn): row 1 is NaN everywhere, row 0 is 256 * 1.5 * 2 = 768."""
    a, b = const_operands(2, 5, 256, a_code=1.5, b_code=2.0)
    a.view(torch.uint8)[1, 200] = 0x7F
    want = torch.full((2, 5), 768.0)
    want[1] = math.nan
    return (a, torch.ones(2, 2), b, torch.ones(1, 2)), want


def case_all_negative_zero_gives_positive_zero():
    """Every product is -0.0: the accumulator starts at +0.0, so C is +0.0 (bits 0)."""
    a, b = const_operands(2, 3, 128, a_code=-0.0, b_code=1.0)
    return (a, torch.ones(2, 1), b, torch.ones(1, 1)), torch.zeros(2, 3)


def case_overflow_rounds_to_inf():
    """448 * 448 * 128 * 2**120 overflows fp32 (and every output format): +Inf, and -Inf for negative b."""
    a, b = const_operands(1, 2, 128, a_code=448.0, b_code=448.0)
    b[1] = torch.full((128,), -448.0).to(FP8)
    want = torch.tensor([[math.inf, -math.inf]])
    return (a, torch.full((1, 1), 2.0**60), b, torch.full((1, 1), 2.0**60)), want


NAMED = {
    f.__name__.removeprefix("case_"): f
    for f in (
        case_scale_per_k_block,
        case_n_not_a_multiple_of_128,
        case_nan_code_poisons_its_row,
        case_all_negative_zero_gives_positive_zero,
        case_overflow_rounds_to_inf,
    )
}


@pytest.mark.parametrize("out_dtype", ref.OUT_DTYPES, ids=str)
@pytest.mark.parametrize("name", sorted(NAMED))
def test_named_cases(name, out_dtype, device):
    operands, want = NAMED[name]()
    want = want.to(out_dtype)
    assert_exact(ref.block_fp8_gemm_mirror(*operands, out_dtype=out_dtype), want, f"{name} (mirror)")
    assert_exact(run_kernel(operands, device, out_dtype).cpu(), want, f"{name} (kernel)")
    tiled = kernel.launch_block_fp8_gemm(*on(device, operands), out_dtype=out_dtype, gemv=False)
    assert_exact(tiled.cpu(), want, f"{name} (tiled kernel)")  # where the op's choice is the GEMV
    for config in (kernel.WGMMA_CONFIG, kernel.WGMMA_WS_CONFIG):
        args = on(device, operands)
        # The output is allocated from poisoned memory: a byte the kernel leaves unwritten reads 0xFF (NaN), not the
        # equal bytes of the launch before, whose freed output the allocator would hand out again.
        fill_free_memory(device, POISON)
        wgmma = kernel.launch_block_fp8_gemm(*args, out_dtype=out_dtype, config=config)
        assert_exact(wgmma.cpu(), want, f"{name} (wgmma kernel, or its tiled twin; {config})")


def test_fp16_output_overflows_where_fp32_does_not(device):
    """C = 128 * 1024 = 131072: finite in bf16 and fp32, beyond fp16's 65504: +Inf (RNE cast)."""
    a, b = const_operands(1, 1, 128)
    operands = (a, torch.full((1, 1), 32.0), b, torch.full((1, 1), 32.0))
    for out_dtype, want in ((torch.float16, math.inf), (torch.bfloat16, 131072.0), (torch.float32, 131072.0)):
        assert run_kernel(operands, device, out_dtype).item() == want
        assert ref.block_fp8_gemm_mirror(*operands, out_dtype=out_dtype).item() == want


# ---- the 128x128 weight quantizer ----
def test_block_quantizer_is_per_tensor_quantization_of_each_tile():
    g = torch.Generator().manual_seed(9)
    w = torch.randn(200, 300, generator=g) * 4
    q, scales = quant.quantize_fp8_blocks(w, block=128)
    assert scales.shape == (2, 3) and q.shape == w.shape
    for i in range(2):
        for j in range(3):
            tile = w[i * 128 : (i + 1) * 128, j * 128 : (j + 1) * 128]  # edge tiles are smaller: padding is 0
            want_q, want_s = quant.quantize_fp8(tile.contiguous(), granularity="tensor")
            assert_exact(scales[i, j].reshape(1), want_s, f"scale of tile {i},{j}")
            assert_exact(q[i * 128 : (i + 1) * 128, j * 128 : (j + 1) * 128], want_q, f"codes of tile {i},{j}")
    back = quant.dequantize_fp8_blocks(q, scales)
    assert ((back - w).abs() <= w.abs() * 2.0**-4 + scales.max() * 2.0**-10).all()


def test_block_quantizer_bad_arguments():
    with pytest.raises(ValueError, match="w: must be 2-D"):
        quant.quantize_fp8_blocks(torch.zeros(2, 2, 128))
    with pytest.raises(TypeError, match="w: dtype"):
        quant.quantize_fp8_blocks(torch.zeros(2, 128, dtype=torch.int32))
    with pytest.raises(ValueError, match="block"):
        quant.quantize_fp8_blocks(torch.zeros(2, 128), block=0)


# ---- the op ----
# opcheck's test_schema compares inputs before and after the call with float arithmetic that torch does not
# implement for float8_e4m3fn ("mul_cpu_reduced_float" not implemented); the test checks the bytes instead.
OPCHECK_UTILS = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


def test_opcheck(device):
    operands = on(device, make_operands(5, 130, 256, seed=3, spread=2.0)[0])
    before = [t.clone() for t in operands]
    torch.library.opcheck(
        torch.ops.touchstone.block_fp8_gemm.default, (*operands, torch.bfloat16), test_utils=OPCHECK_UTILS
    )
    for name, old, new in zip(("a", "a_scales", "b", "b_scales"), before, operands, strict=True):
        assert torch.equal(
            old.view(torch.uint8) if old.dtype == FP8 else old, new.view(torch.uint8) if new.dtype == FP8 else new
        ), f"{name} was mutated"


def _bad(**change):
    a, a_scales, b, b_scales = (
        torch.zeros(4, 256, dtype=FP8),
        torch.ones(4, 2),
        torch.zeros(130, 256, dtype=FP8),
        torch.ones(2, 2),
    )
    args = dict(a=a, a_scales=a_scales, b=b, b_scales=b_scales, out_dtype=torch.bfloat16)
    args.update(change)
    return args


BAD = [
    (_bad(a=torch.zeros(4, 256, dtype=torch.bfloat16)), TypeError, "a: dtype"),
    (_bad(b=torch.zeros(130, 256, dtype=torch.float8_e5m2)), TypeError, "b: dtype"),
    (_bad(b=torch.zeros(130, 128, dtype=FP8)), ValueError, "b: K"),
    (_bad(a=torch.zeros(4, 200, dtype=FP8), b=torch.zeros(130, 200, dtype=FP8)), ValueError, "partial K blocks"),
    (_bad(a_scales=torch.ones(4, 2, dtype=torch.float64)), TypeError, "a_scales"),
    (_bad(a_scales=torch.ones(4, 1)), ValueError, r"a_scales: shape must be \(4, 2\)"),
    (_bad(b_scales=torch.ones(1, 2)), ValueError, r"b_scales: shape must be \(2, 2\)"),
    (_bad(out_dtype=torch.int32), TypeError, "out_dtype"),
]


@pytest.mark.parametrize(("args", "error", "message"), BAD, ids=[m for _, _, m in BAD])
def test_bad_arguments(args, error, message, device):
    with pytest.raises(error, match=message):
        ref.block_fp8_gemm_mirror(**args)
    moved = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in args.items()}
    with pytest.raises(error, match=message):
        kernel.block_fp8_gemm(**moved)


def test_kernel_boundary_layouts(device):
    (a, a_scales, b, b_scales), ideal = make_operands(4, 64, 256, seed=1, spread=0.0)
    a, a_scales, b, b_scales = on(device, (a, a_scales, b, b_scales))
    with pytest.raises(ValueError, match="a: K must be the contiguous dim"):
        kernel.block_fp8_gemm(a.t().contiguous().t(), a_scales, b, b_scales)
    wide = torch.zeros(64, 264, dtype=FP8, device=device)  # row stride 264 bytes: not 16-byte aligned
    wide[:, :256] = b
    with pytest.raises(ValueError, match="b: TMA needs a 16-byte aligned"):
        kernel.block_fp8_gemm(a, a_scales, wide[:, :256], b_scales)
    aligned = torch.zeros(64, 384, dtype=FP8, device=device)  # a column slice with an aligned stride is read as is
    aligned[:, 128:] = b
    got = kernel.block_fp8_gemm(a, a_scales, aligned[:, 128:], b_scales, out_dtype=torch.float32)
    mirror = ref.block_fp8_gemm_mirror(*(t.cpu() for t in (a, a_scales, b, b_scales)), out_dtype=torch.float32)
    assert_lossy(FAMILY, got, mirror, ideal, "strided b")


TILED_128 = Config(block_m=128, block_n=128, group_m=16, num_warps=8, num_stages=3)


@pytest.mark.parametrize("warp_specialize", [False, True], ids=["one_partition", "warp_specialized"])
@pytest.mark.parametrize(
    "programs,stages",
    [(0, 4), (1, 4), (3, 3), (2, 1)],
    ids=["grid", "one_program", "three_programs", "two_programs_one_stage_asked"],
)
@pytest.mark.parametrize(
    "m,n,k_blocks",
    [(65, 256, 1), (200, 528, 2), (333, 130, 3), (130, 384, 5), (257, 8, 4), (3, 24, 2)],
    ids=["one_block", "two_blocks", "odd_blocks_unaligned_rows", "five_blocks", "one_column_tile", "three_rows"],
)
def test_wgmma_kernel_bit_equals_the_tiled_kernel(m, n, k_blocks, programs, stages, warp_specialize, device):
    """The wgmma kernel does the tiled kernel's arithmetic in the same order: equal bytes for every output dtype,
    over odd and even K block counts (its loop takes two blocks a trip), rows of C that TMA can store and rows it
    cannot (N = 130: 260-byte bf16 rows), partial last tiles (M = 65: the second consumer warp group's rows all but
    one past C), fewer rows than a warp group takes (M = 3: C's 48-byte rows stored by TMA from a box past C in both
    dimensions); one tile a program (grid) or several walked by each of 1-3 programs, so a tile's last steps load
    the next tile's first blocks, or the producer warp runs ahead across tiles (unevenly shared: 10 tiles over 3
    programs); one stage asked for (the launcher takes two wherever a tile has two K blocks, `stage_count`); with
    all warps in one partition and warp-specialized."""
    operands, ideal = make_operands(m, n, 128 * k_blocks, seed=m + n, spread=4.0)
    args = on(device, operands)
    if not wgmma_kernel.runs_on(args[0].device):
        pytest.skip("the wgmma kernel runs on NVIDIA sm_90")
    for out_dtype in ref.OUT_DTYPES:
        got = torch.full((m, n), math.nan, dtype=out_dtype, device=args[0].device)  # poisoned: every byte written
        wgmma_kernel.launch(
            *args, got, 128, 128, group_m=16, stages=stages, num_warps=8, programs=programs,
            warp_specialize=warp_specialize,
        )  # fmt: skip
        tiled = kernel.launch_block_fp8_gemm(*args, out_dtype=out_dtype, config=TILED_128)
        assert_exact(got, tiled, f"{out_dtype} against the tiled kernel")
        assert_lossy(FAMILY, got, ref.block_fp8_gemm_mirror(*operands, out_dtype=out_dtype), ideal)


@pytest.mark.parametrize(
    "asked,k_blocks,fit,warp_specialize,want",
    [
        (4, 1, 5, False, 1),  # one K block walking tiles: one stage, the only one the tile's last step refills
        (1, 3, 5, False, 2),  # one asked: two (block k + 1's MMA is issued before block k's stage is released)
        (6, 3, 5, False, 3),  # no producer warp: at most k_blocks
        (6, 16, 5, False, 5),  # as many as fit beside C
        (6, 1, 5, True, 5),  # the producer warp runs ahead across tiles: not bound by k_blocks
        (1, 1, 5, True, 2),
    ],
)
def test_wgmma_stage_count(asked, k_blocks, fit, warp_specialize, want):
    """The launcher's stages (on the H200 a one-K-block GEMM walking two tiles with one program hung when the
    shared-memory bound raised its one stage back to two)."""
    assert wgmma_kernel.stage_count(asked, k_blocks, fit, warp_specialize) == want


def test_wgmma_configs_it_cannot_take_are_named(device):
    """Refused on every device alike (elsewhere the config would run as its tiled twin)."""
    args = on(device, make_operands(70, 64, 256, 0, 0.0)[0])
    bad = {
        "block_n dividing 128": Config(block_m=128, block_n=256, wgmma=True),
        "split_k 1, got 2": Config(block_m=128, block_n=128, split_k=2, wgmma=True),
        "split_k 1, got 0": Config(block_m=128, block_n=128, split_k=0, wgmma=True),
        "num_warps a multiple of 4 .* got num_warps 2,": Config(block_m=128, block_n=128, num_warps=2, wgmma=True),
        "block_m a multiple of 16 .* got num_warps 8, block_m 64": Config(block_m=64, block_n=128, wgmma=True),
        "num_warps 8 and block_m 128 warp-specialized .* got num_warps 4, block_m 64": Config(
            block_m=64, block_n=128, num_warps=4, warp_specialize=True, wgmma=True
        ),
    }
    for message, config in bad.items():
        with pytest.raises(ValueError, match=f"config: the wgmma kernel takes .*{message}"):
            kernel.launch_block_fp8_gemm(*args, config=config)


# ---- negative controls: a one-block indexing error in the real kernel must fail the tolerance check ----
NEGATIVE_DATA = {
    "vllm_random_scales": lambda seed: vllm_style_operands(24, 300, 512, seed),
    "quantized_randn_spread_1": lambda seed: make_operands(24, 300, 512, seed, spread=1.0),
    "quantized_randn_spread_4": lambda seed: make_operands(24, 300, 512, seed, spread=4.0),
}


WGMMA_SMALL = Config(block_m=64, block_n=128, group_m=1, persistent=True, num_warps=4, num_stages=2, wgmma=True)


# Run by `suites.compile_for_sm90` (a process without the interpreter).
_COMPILE_WGMMA_FOR_SM90 = """
from triton.backends.compiler import GPUTarget
from triton.compiler import compile
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource
from kernels import block_fp8_gemm as gemm
from kernels import block_fp8_gemm_wgmma as kernel

SM90_SHARED = 232448  # bytes of shared memory a CTA may take on sm_90 (H100, H200)
GL = {"fp8e4nv": gl.float8e4nv, "bf16": gl.bfloat16, "fp32": gl.float32}


def desc(dtype, shape):
    layout = gl.NVMMASharedLayout.get_default_for(shape, GL[dtype])
    return f"tensordesc<{dtype}[{shape[0]}, {shape[1]}],{layout!r}>"


for cfg in (gemm.WGMMA_WS_CONFIG, gemm.WGMMA_CONFIG):
    ws = cfg.warp_specialize
    for out, size in (("bf16", 2), ("fp32", 4)):
        for tma_store in (True, False):
            fit = (SM90_SHARED - cfg.block_m * cfg.block_n * size - kernel._BARRIER_BYTES) // (
                (cfg.block_m + cfg.block_n) * kernel.BLOCK_K
            )
            c_rows = cfg.block_m // 2 if ws else cfg.block_m
            signature = {
                "a_desc": desc("fp8e4nv", [cfg.block_m, kernel.BLOCK_K]),
                "b_desc": desc("fp8e4nv", [cfg.block_n, kernel.BLOCK_K]),
                "c_desc": desc(out, [c_rows, cfg.block_n]) if tma_store else "constexpr",
                "c_ptr": "*" + out, "as_ptr": "*fp32", "bs_ptr": "*fp32",
            }
            signature |= dict.fromkeys(("M", "N", "k_blocks", "stride_cm", "stride_asm", "stride_ask", "stride_bsn",
                                        "stride_bsk"), "i32")
            warps = 4 if ws else cfg.num_warps
            constants = dict(GROUP_M=cfg.group_m, STAGES=kernel.stage_count(cfg.num_stages, 64, fit, ws), FAULT=0,
                             WS=ws, CONSUMER_REGS=kernel.CONSUMER_REGS, num_warps=warps)
            if not tma_store:
                constants["c_desc"] = None
            signature |= dict.fromkeys(constants, "constexpr")
            source = GluonASTSource(fn=kernel._block_fp8_gemm_wgmma_kernel, signature=signature, constexprs=constants)
            options = {"num_warps": warps} | ({"maxnreg": kernel.WS_MAXNREG} if ws else {})
            compiled = compile(source, target=GPUTarget("cuda", 90, 32), options=options)
            print(ws, out, tma_store, "wgmma" in compiled.asm["ptx"], len(compiled.asm["cubin"]) > 0)
"""


def test_wgmma_kernel_compiles_for_sm90():
    """The Gluon GEMM's two launch-table rows (warp-specialized for M > 64 on sm_90, all warps in one partition),
    with bf16 and fp32 C, stored through TMA and from registers, through Triton's compiler for sm_90 with no GPU:
    Gluon does not run in the interpreter, so without this a change that breaks its compilation shows only on a
    GPU. Each compiles to wgmma and a cubin."""
    from suites.compile_for_sm90 import run_compiler

    want = [f"{ws} {out} {tma} True True" for ws in (True, False) for out in ("bf16", "fp32") for tma in (True, False)]
    assert run_compiler(_COMPILE_WGMMA_FOR_SM90) == want


@pytest.mark.parametrize("path", ["tiled", "gemv", "wgmma", "wgmma_ws"])
@pytest.mark.parametrize("data", sorted(NEGATIVE_DATA))
@pytest.mark.parametrize("fault", ["weight_scale_next_k_block", "weight_scale_next_n_block"])
def test_negative_control_one_block_off(fault, data, path, device):
    """On the tiled GEMM, and where they run the tensor-core GEMV of `kernels.block_fp8_gemv` and the wgmma kernel
    of `kernels.block_fp8_gemm_wgmma`."""
    where = on(device, NEGATIVE_DATA[data](0)[0])[0].device
    if path == "gemv" and not packed_ptx(where):
        pytest.skip("the tensor-core GEMV's PTX runs on NVIDIA sm_90+")
    if path.startswith("wgmma") and not wgmma_kernel.runs_on(where):
        pytest.skip("the wgmma kernel runs on NVIDIA sm_90")
    gemv = path == "gemv"
    config = {
        "tiled": Config(block_m=32, block_n=128, group_m=1, num_warps=4, num_stages=1),
        "wgmma": WGMMA_SMALL,
        "wgmma_ws": kernel.WGMMA_WS_CONFIG,
    }
    config = config.get(path)
    for seed in range(2):
        operands, ideal = NEGATIVE_DATA[data](seed)
        mirror = ref.block_fp8_gemm_mirror(*operands, out_dtype=torch.bfloat16)
        assert_lossy(FAMILY, run_kernel(operands, device, torch.bfloat16, config, gemv=gemv), mirror, ideal)
        with pytest.raises(AssertionError, match="rms_rel"):
            got = run_kernel(operands, device, torch.bfloat16, config, fault, gemv=gemv)
            assert_lossy(FAMILY, got, mirror, ideal)


def test_gemv_arguments_it_cannot_take_are_named(device):
    from kernels.block_fp8_gemv import launch_fp8_gemv

    operands, _ = make_operands(2, 64, 128, 0, 0.0)
    args = on(device, operands)
    config = Config(block_m=32, block_n=128, group_m=1, num_warps=4, num_stages=1)
    with pytest.raises(ValueError, match="config"):
        kernel.launch_block_fp8_gemm(*args, config=config, gemv=True)
    out = torch.empty(2, 64, dtype=torch.bfloat16, device=args[0].device)
    with pytest.raises(ValueError, match="U"):
        launch_fp8_gemv(*args, out, launch=(3, 4))


def test_gemv_where_its_ptx_cannot_run_is_refused(device):
    operands, ideal = make_operands(2, 64, 128, 0, 0.0)
    args = on(device, operands)
    if packed_ptx(args[0].device):
        pytest.skip("the GEMV runs here")
    with pytest.raises(ValueError, match="gemv"):
        kernel.launch_block_fp8_gemm(*args, gemv=True)
    assert_lossy(FAMILY, kernel.block_fp8_gemm(*args), ref.block_fp8_gemm_mirror(*operands), ideal)
