"""W4A16 NVFP4 GEMM: the Triton kernel against the precision-mirroring reference and the ideal one.

Lossy-op policy (kernels.tolerances, row "w4a16_nvfp4_gemm"): max/RMS relative error against the mirror (the
kernel sums fp32 in its own order, so a bf16 rounding may flip by one ulp) and an SQNR floor against the fp64
product with the weights before quantization. Named cases pin exact outputs where the arithmetic leaves no freedom
(one-hot activations select single weights; the global scale a power of two). Negative controls: bugs planted
in the kernel (kernels.w4a16_nvfp4_gemm.FAULTS) that the check must catch.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kernels.tolerances import assert_exact, assert_lossy, families
from reference.gemm import w4a16_nvfp4 as ref
from reference.quant.nvfp4 import quantize_nvfp4
from reference.quant.nvfp4_global_scale import DecodeScale, EncodeScale, tensor_amax
from suites import oracles
from suites.quant.mxfp4_cases import random_blocks

kernel = pytest.importorskip("kernels.w4a16_nvfp4_gemm")
FAMILY = families.W4A16_NVFP4_GEMM
CONVENTIONS = {"decode": DecodeScale, "encode": EncodeScale}


def quantized_weights(n: int, k: int, seed: int, spread: float, convention: str = "decode", stale: float = 1.0):
    """Random bf16 weights (blocks of 16 spread over 2**+-spread) and their NVFP4 codes, scales and global scale
    (from the tensor's amax times `stale`: a larger one leaves the block scales small)."""
    w = random_blocks((n, k), torch.float32, seed, spread, block=16).to(torch.bfloat16)
    scale = CONVENTIONS[convention].from_amax(tensor_amax(w) * stale)
    codes, scales = quantize_nvfp4(w, scale)
    return w, codes, scales, scale


def activations(m: int, k: int, seed: int, spread: float = 2.0) -> torch.Tensor:
    return random_blocks((m, k), torch.float32, seed, spread, block=16).to(torch.bfloat16)


def on(device, scale):
    return type(scale)(scale.value.to(device))


def check(x, codes, scales, scale, device, ideal, gemm=kernel.w4a16_nvfp4_gemm):
    got = gemm(x.to(device), codes.to(device), scales.to(device), on(device, scale))
    assert got.dtype == torch.bfloat16 and got.shape == (x.shape[0], codes.shape[0])
    return assert_lossy(FAMILY, got.cpu(), ref.w4a16_nvfp4_gemm_mirror(x, codes, scales, scale), ideal)


@st.composite
def problems(draw):
    return dict(
        m=draw(st.sampled_from([1, 1, 2, 3, 8, 17, 33])),
        n=draw(st.integers(16, 40)),
        k=16 * draw(st.integers(1, 14)),
        seed=draw(st.integers(0, 2**31 - 1)),
        spread=draw(st.sampled_from([0.0, 2.0, 4.0])),
        convention=draw(st.sampled_from(list(CONVENTIONS))),
        stale=draw(st.sampled_from([1.0, 4.0])),
        zero_block=draw(st.booleans()),
    )


@given(p=problems())
def test_matches_mirror_and_ideal(p, device):
    w, codes, scales, scale = quantized_weights(p["n"], p["k"], p["seed"], p["spread"], p["convention"], p["stale"])
    if p["zero_block"]:  # an all-zero block: scale byte 0
        w[0, :16] = 0.0
        codes[0, :8], scales[0, 0] = 0, 0
    x = activations(p["m"], p["k"], p["seed"] + 1)
    check(x, codes, scales, scale, device, oracles.unquantized_product(x, w))


@given(
    seed=st.integers(0, 2**31 - 1),
    m=st.sampled_from([1, 5]),
    nan_row=st.integers(0, 5),
    byte=st.sampled_from([0x7F, 0xFF]),
)
def test_nan_scale_poisons_its_row_only(seed, m, nan_row, byte, device):
    _, codes, scales, scale = quantized_weights(6, 48, seed, 2.0)
    scales[nan_row, 1] = byte
    x = activations(m, 48, seed + 1)
    got = kernel.w4a16_nvfp4_gemm(x.to(device), codes.to(device), scales.to(device), on(device, scale)).cpu()
    assert got[:, nan_row].isnan().all()
    assert not got[:, [r for r in range(6) if r != nan_row]].isnan().any()
    check(x, codes, scales, scale, device, ref.w4a16_nvfp4_gemm_ideal(x, codes, scales, scale))


# Named cases: (name, x rows of one K = 32 problem as {index: value}, code bytes of row 0 as {byte: value}, E4M3
# scale bytes of row 0's two blocks, the decode global scale, expected y[., 0] per x row). Every other code byte is
# 0x00 (+0), every other scale byte 0x38 (1.0).
NAMED = [
    (
        "nibble_order_and_block_scale",
        [{0: 1.0}, {1: 1.0}, {17: 1.0}],
        {0: 0x21, 8: 0x70},
        (0x40, 0x30),
        1.0,
        [1.0, 2.0, 3.0],
        "byte 0 = 0x21: element 0 is code 1 (0.5), element 1 code 2 (1.0), times scale 0x40 (2.0); block 1 byte 0 "
        "= 0x70: element 17 is code 7 (6), times scale 0x30 (0.5)",
    ),
    (
        "negative_codes_and_scale_sign",
        [{0: 1.0}, {1: -2.0}, {16: 1.0}],
        {0: 0xF9, 8: 0x02},
        (0x38, 0xB8),
        1.0,
        [-0.5, 12.0, -1.0],
        "0xF9: element 0 code 9 (-0.5), element 1 code 0xF (-6), -2 * -6 = 12; block 1's scale byte 0xB8 is -1.0",
    ),
    (
        "global_scale_applied_once",
        [{0: 1.0, 1: 1.0}],
        {0: 0x77},
        (0x7E, 0x38),
        2.0**-20,
        [6.0 * 448 * 2 * 2.0**-20],
        "two weights of 6 * 448 (E4M3's largest scale, 0x7E): their sum times 2**-20, exact",
    ),
    (
        "smallest_block_scale",
        [{0: 2.0**40}],
        {0: 0x01},
        (0x01, 0x38),
        1.0,
        [0.5 * 2.0**-9 * 2.0**40],
        "scale byte 0x01 is E4M3's smallest subnormal 2**-9; code 1 is 0.5",
    ),
    (
        "one_rounding_tie_to_even",
        [{0: 1.0, 16: 2.0**-8}],
        {0: 0x02, 8: 0x02},
        (0x38, 0x38),
        1.0,
        [1.0],
        "1 + 2**-8 is exact in fp32 and a bf16 tie: RNE gives 1.0",
    ),
    (
        "fp32_overflow_to_inf",
        [{0: 2.0**100, 1: 2.0**100}],
        {0: 0x77},
        (0x7E, 0x38),
        2.0**20,
        [math.inf],
        "2 * 2**100 * 2688 * 2**20 is past fp32 max",
    ),
]


def named_problem(x_rows, code_bytes, scale_bytes):
    x = torch.zeros(len(x_rows), 32)
    for r, row in enumerate(x_rows):
        for i, v in row.items():
            x[r, i] = v
    codes = torch.zeros(3, 16, dtype=torch.uint8)
    for i, v in code_bytes.items():
        codes[0, i] = v
    codes[1:] = codes[0].roll(1)  # rows 1 and 2: other weights, so that a wrong row index shows
    scales = torch.full((3, 2), 0x38, dtype=torch.uint8)
    scales[0] = torch.tensor(scale_bytes, dtype=torch.uint8)
    return x.to(torch.bfloat16), codes, scales


@pytest.mark.parametrize("rows", [1, 17], ids=["one_row", "two_row_tiles"])
@pytest.mark.parametrize(
    ("name", "x_rows", "code_bytes", "scale_bytes", "decode", "want", "note"), NAMED, ids=[c[0] for c in NAMED]
)
def test_named_cases(name, x_rows, code_bytes, scale_bytes, decode, want, note, rows, device):
    x, codes, scales = named_problem(x_rows, code_bytes, scale_bytes)
    scale = DecodeScale(decode)
    want = torch.tensor(want, dtype=torch.bfloat16)
    assert_exact(ref.w4a16_nvfp4_gemm_mirror(x, codes, scales, scale)[:, 0], want, f"{name}: mirror ({note})")
    for r in range(x.shape[0]):
        xr = x[r : r + 1].expand(rows, -1).contiguous()
        got = kernel.w4a16_nvfp4_gemm(xr.to(device), codes.to(device), scales.to(device), on(device, scale)).cpu()
        assert_exact(got[:, 0], want[r].expand(rows), f"{name}: kernel, x row {r} ({note})")


@pytest.mark.parametrize("split_k", [1, 2, 4])
@pytest.mark.parametrize("m", [1, 20])
def test_split_k_and_ragged_k_tiles(split_k, m, device):
    """K = 7 blocks in tiles of 2 (the last tile half empty), split over up to 4 programs per output (one K tile
    each), each split's partial times the global scale before the splits are added."""
    w, codes, scales, scale = quantized_weights(24, 112, 5, 3.0, "encode")
    x = activations(m, 112, 6, 3.0)
    config = (16, 16, 2, split_k, 4, 1)
    check(
        x, codes, scales, scale, device, oracles.unquantized_product(x, w),
        gemm=lambda *args: kernel.launch(*args[:3], args[3].to_decode().value, config=config),
    )  # fmt: skip


def test_strided_rows_are_read_in_place(device):
    w, codes, scales, scale = quantized_weights(20, 256, 7, 2.0)
    x = activations(3, 256, 8)[:, 64:192]  # K = 128 of a wider activation
    for m in (1, 3):
        check(x[:m], codes[:, 32:96], scales[:, 4:12], scale, device, oracles.unquantized_product(x[:m], w[:, 64:192]))


def test_empty_and_degenerate_shapes(device):
    codes, scales, scale = (
        torch.zeros(4, 8, dtype=torch.uint8),
        torch.full((4, 1), 0x38, dtype=torch.uint8),
        DecodeScale(1.0),
    )
    got = kernel.w4a16_nvfp4_gemm(
        torch.zeros(0, 16, dtype=torch.bfloat16, device=device), codes.to(device), scales.to(device), on(device, scale)
    )
    assert got.shape == (0, 4)
    y = kernel.w4a16_nvfp4_gemm(
        torch.ones(2, 0, dtype=torch.bfloat16, device=device),
        torch.zeros(4, 0, dtype=torch.uint8, device=device),
        torch.zeros(4, 0, dtype=torch.uint8, device=device),
        on(device, scale),
    )
    assert_exact(y.cpu(), torch.zeros(2, 4, dtype=torch.bfloat16))


def test_mirror_is_the_ideal_rounded_once():
    """The mirror differs from the exact product by one bf16 rounding, the global scale's fp32 rounding and fp32
    reassociation."""
    _, codes, scales, scale = quantized_weights(64, 512, 9, 4.0, "encode")
    x = activations(8, 512, 10, 8.0)
    ideal = ref.w4a16_nvfp4_gemm_ideal(x, codes, scales, scale)
    magnitude = x.double().abs() @ ref.dequantize_exact(codes, scales, scale).abs().T
    error = (ref.w4a16_nvfp4_gemm_mirror(x, codes, scales, scale).double() - ideal).abs()
    assert (error <= ideal.abs() * (2.0**-8 + 2.0**-23) + magnitude * 512 * 2.0**-24).all()


def test_opcheck(device):
    _, codes, scales, scale = quantized_weights(16, 64, 11, 2.0)
    x = activations(2, 64, 12)
    args = (x.to(device), codes.to(device), scales.to(device), scale.value.to(device))
    torch.library.opcheck(torch.ops.touchstone.w4a16_nvfp4_gemm.default, args)


def _args(**change):
    args = dict(
        x=torch.zeros(2, 32, dtype=torch.bfloat16),
        codes=torch.zeros(3, 16, dtype=torch.uint8),
        scales=torch.zeros(3, 2, dtype=torch.uint8),
        global_scale=DecodeScale(1.0),
    )
    args.update(change)
    return args


@pytest.mark.parametrize(
    ("args", "error", "message"),
    [
        (_args(x=torch.zeros(2, 32)), TypeError, "x: dtype"),
        (_args(codes=torch.zeros(3, 16, dtype=torch.int8)), TypeError, "codes: dtype"),
        (_args(scales=torch.zeros(3, 2, dtype=torch.float8_e4m3fn)), TypeError, "scales: dtype"),
        (_args(x=torch.zeros(2, 24, dtype=torch.bfloat16)), ValueError, "x: K = 24"),
        (_args(codes=torch.zeros(3, 8, dtype=torch.uint8)), ValueError, "codes: shape"),
        (_args(scales=torch.zeros(3, 1, dtype=torch.uint8)), ValueError, "scales: shape"),
        (_args(x=torch.zeros(32, dtype=torch.bfloat16)), ValueError, "x: must be 2-D"),
        (_args(global_scale=torch.tensor(1.0)), TypeError, "global_scale: must be an EncodeScale"),
    ],
)
def test_bad_arguments(args, error, message, device):
    for impl, dev in ((ref.w4a16_nvfp4_gemm_mirror, "cpu"), (kernel.w4a16_nvfp4_gemm, device)):
        moved = [t.to(dev) if isinstance(t, torch.Tensor) else t for t in args.values()]
        with pytest.raises(error, match=message):
            impl(*moved)


def test_kernel_rejects_a_k_dim_it_cannot_read(device):
    x = torch.zeros(32, 2, dtype=torch.bfloat16, device=device).T  # K not contiguous
    codes, scales = (
        torch.zeros(3, 16, dtype=torch.uint8, device=device),
        torch.zeros(3, 2, dtype=torch.uint8, device=device),
    )
    with pytest.raises(ValueError, match="x: last dim must have stride 1"):
        kernel.w4a16_nvfp4_gemm(x, codes, scales, on(device, DecodeScale(1.0)))


@pytest.mark.gpu_only(reason="the packed decode is PTX (NVIDIA sm_90+); the interpreter runs the fp32 decode")
@pytest.mark.parametrize(("m", "n", "k", "config"), [(1, 40, 112, None), (20, 24, 112, (16, 16, 2, 2, 4, 1)),
                                                     (64, 300, 1024, None), (5, 33, 8192, None)])  # fmt: skip
def test_packed_and_fp32_decodes_give_the_same_bytes(m, n, k, config, device):
    """The packed decode (bf16x2 PTX on int32 words, x permuted to the words' order) against the fp32 decode of the
    same launch: every output bit equal, a NaN scale byte and ragged K tiles included."""
    _, codes, scales, scale = quantized_weights(n, k, m + k, 4.0)
    scales[n // 2, 0] = 0x7F
    x = activations(m, k, m + k + 1).to(device)
    args = (x, codes.to(device), scales.to(device), scale.value.to(device))
    assert kernel.packed_decode(args[1])
    packed = kernel.launch(*args, config=config, packed=True)
    assert_exact(packed.cpu(), kernel.launch(*args, config=config, packed=False).cpu(), "packed vs fp32 decode")
    assert packed[:, n // 2].isnan().all()


def test_packed_decode_is_refused_where_it_cannot_run(device):
    """packed=True on codes that are not whole int32 words a row (or off NVIDIA sm_90+) is refused, naming it."""
    _, codes, scales, scale = quantized_weights(8, 32, 3, 2.0)
    shifted = torch.zeros(8, 18, dtype=torch.uint8)
    shifted[:, 2:] = codes
    x = activations(2, 32, 4)
    args = (x.to(device), shifted.to(device)[:, 2:], scales.to(device), scale.value.to(device))
    assert not kernel.packed_decode(args[1])
    with pytest.raises(ValueError, match="packed=True"):
        kernel.launch(*args, packed=True)
    got = kernel.launch(*args)  # the fp32 decode, in place
    assert_exact(got.cpu(), kernel.launch(*args, packed=False).cpu(), "default vs fp32 decode")


# Negative controls: bugs planted in the real kernel that the lossy check against the mirror must catch; spread 4
# makes neighbouring blocks' scales differ, and a global scale of 2**-3 makes its omission visible.
def faulty(fault: str):
    return lambda x, codes, scales, scale: kernel.launch(x, codes, scales, scale.to_decode().value, fault=fault)


@pytest.mark.parametrize("m", [1, 17])
@pytest.mark.parametrize("fault", ["scale_of_next_block", "swap_nibbles", "no_global_scale"])
def test_negative_control(fault, m, device):
    w, codes, scales, scale = quantized_weights(16, 128, 13, 4.0)
    x = activations(m, 128, 14)
    with pytest.raises(AssertionError, match="max_rel"):
        check(x, codes, scales, scale, device, oracles.unquantized_product(x, w), gemm=faulty(fault))
    check(x, codes, scales, scale, device, oracles.unquantized_product(x, w), gemm=faulty("none"))


# Run by `suites.compile_for_sm90` (a process without the interpreter).
_COMPILE_FOR_SM90 = """
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, compile
from kernels import w4a16_nvfp4_gemm as kernel

names = ("M", "N", "n_blocks", "tiles_per_split", "x_row_stride", "codes_row_stride", "scales_row_stride")
for packed in (False, True):
    pointers = {"x_ptr": "*bf16", "codes_ptr": "*i32" if packed else "*u8", "scales_ptr": "*u8", "decode_ptr": "*fp32"}
    for i, (_, block_n, block_m, groups, _, warps, stages) in enumerate(kernel._GPU_CONFIGS):
        out_fp32 = i % 2 == 1
        constants = dict(
            BLOCK_N=block_n, BLOCK_M=block_m, GROUPS=groups, EVEN_K=i > 0, OUT_FP32=out_fp32, FAULT=0, PACKED=packed
        )
        signature = {**pointers, "out_ptr": "*fp32" if out_fp32 else "*bf16", **dict.fromkeys(names, "i32")}
        signature |= {"out_row_stride": "i32", "out_split_stride": "i32", **dict.fromkeys(constants, "constexpr")}
        source = ASTSource(fn=kernel._w4a16_nvfp4_kernel, signature=signature, constexprs=constants)
        options = {"num_warps": warps, "num_stages": stages}
        compiled = compile(source, target=GPUTarget("cuda", 90, 32), options=options)
        print(packed, i, "wgmma" in compiled.asm["ptx"], len(compiled.asm["cubin"]) > 0)
"""


def test_every_gpu_config_compiles_for_sm90():
    """Each launch-table row (the first in its ragged-K form), in both decodes, through Triton's compiler for sm_90,
    no GPU needed: the interpreter runs kernels Python-side and misses what only the compiler rejects (a
    non-constexpr global, a layout the MMA cannot take, PTX that ptxas refuses). Each compiles to wgmma and a
    cubin."""
    from suites.compile_for_sm90 import run_compiler

    rows = range(len(kernel._GPU_CONFIGS))
    assert run_compiler(_COMPILE_FOR_SM90) == [f"{p} {i} True True" for p in (False, True) for i in rows]
