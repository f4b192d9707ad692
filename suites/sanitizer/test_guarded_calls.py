"""Every kernel that reads per-block (or per-slot) scales or writes packed outputs, called with guard bytes after
each input and with its outputs and workspaces allocated from poisoned memory (suites.guard_bytes): the same bytes as
with zeroed surroundings, every guard byte intact. Shapes have ragged edges (rows and blocks that do not fill
a tile) so that masks at the ends are exercised. Small on purpose: `python -m suites.sanitize` runs this file
under compute-sanitizer's memcheck, racecheck and initcheck.

Negative control: the W4A16 GEMM with a planted read of one scale past the end (fault "scale_past_end") is
caught, on the GPU and by the interpreter alike."""

from __future__ import annotations

import functools

import pytest
import torch

from kernels import (
    block_fp8_gemm,
    fp8_quant,
    mxfp4,
    mxfp4_fragment_dequantize,
    mxfp4_fragment_layout,
    nvfp4,
    paged_decode,
    rms_norm,
    w4a16_mxfp4_fragment_gemv,
    w4a16_mxfp4_gemm,
    w4a16_nvfp4_gemm,
)
from kernels._packed_ptx import packed_ptx
from kernels.w4a16_mxfp4_layout import prepare_codes
from reference.quant.fp8 import quantize_fp8 as ref_quantize_fp8
from reference.quant.fp8 import quantize_fp8_blocks
from reference.quant.mxfp4 import quantize_mxfp4
from reference.quant.nvfp4 import quantize_nvfp4
from reference.quant.nvfp4_global_scale import DecodeScale, EncodeScale, tensor_amax
from suites.attention.paged_cases import build_fp8, fixed
from suites.guard_bytes import assert_guarded_call_agrees


def _x(rows: int, cols: int, seed: int = 0, dtype=torch.bfloat16) -> torch.Tensor:
    return (torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed)) * 3).to(dtype)


def _w4a16_inputs(m: int) -> dict[str, torch.Tensor]:
    codes, scales = quantize_mxfp4(_x(19, 96, seed=1), scale_mode="even")
    return {"x": _x(m, 96, seed=2), "codes": codes, "scales": scales}


def _w4a16_prepared_inputs(m: int) -> dict[str, torch.Tensor]:
    inputs = _w4a16_inputs(m)
    return {**inputs, "codes": prepare_codes(inputs["codes"])}


def _fragment_inputs(m: int) -> dict[str, torch.Tensor]:
    codes, scales = quantize_mxfp4(_x(32, 192, seed=1), scale_mode="even")
    words, pairs = mxfp4_fragment_layout.prepare(codes, scales)
    return {"x": _x(m, 192, seed=2), "words": words, "pairs": pairs}


def _fragment_gemv_teams(x, words, pairs):
    """The GEMV's warp-team form (two teams of four warps) where its PTX runs: above GEMV_MAX_M rows the op takes
    the tiled GEMM, so the launch asks for it; elsewhere the op (its tiled GEMM)."""
    if packed_ptx(x.device):
        return w4a16_mxfp4_fragment_gemv.launch(x, words, pairs, config=(8, 2, 1, 1, 2), gemv=True)
    return w4a16_mxfp4_fragment_gemv.w4a16_mxfp4_fragment_gemv(x, words, pairs)


def _nvfp4_quantize(x):
    return nvfp4.quantize_nvfp4(x, EncodeScale.from_amax(tensor_amax(x)))


def _nvfp4_dequantize(codes, scales):
    return nvfp4.dequantize_nvfp4(codes, scales, DecodeScale.from_amax(6.0 * 448.0).to(codes.device))


_NVFP4_WEIGHTS = DecodeScale.from_amax(8.0)  # amax of _x's values: 3 sigma of 3 and some


def _w4a16_nvfp4_inputs(m: int) -> dict[str, torch.Tensor]:
    """K = 80: five blocks of 16, so the last K tile of two blocks is ragged."""
    codes, scales = quantize_nvfp4(_x(19, 80, seed=1), _NVFP4_WEIGHTS)
    return {"x": _x(m, 80, seed=2), "codes": codes, "scales": scales}


def _w4a16_nvfp4(x, codes, scales, fault: str = "none"):
    return w4a16_nvfp4_gemm.launch(x, codes, scales, _NVFP4_WEIGHTS.value.to(x.device), fault=fault)


def _block_fp8_inputs() -> dict[str, torch.Tensor]:
    a, a_scales = ref_quantize_fp8(_x(5, 256, seed=3), granularity="group", group_size=128)
    b, b_scales = quantize_fp8_blocks(_x(200, 256, seed=4), block=128)
    return {"a": a, "a_scales": a_scales, "b": b, "b_scales": b_scales}


def _block_fp8_wgmma_inputs() -> dict[str, torch.Tensor]:
    """M = 130 (past 64: the wgmma kernel on sm_90, a partial last row tile), K = 384, N = 200."""
    a, a_scales = ref_quantize_fp8(_x(130, 384, seed=5), granularity="group", group_size=128)
    b, b_scales = quantize_fp8_blocks(_x(200, 384, seed=6), block=128)
    return {"a": a, "a_scales": a_scales, "b": b, "b_scales": b_scales}


def _paged_decode_fp8_inputs(head: int = 64) -> dict[str, torch.Tensor]:
    """Two sequences (37 and 20 tokens: partial last blocks) over an FP8 cache with per-slot scales (head 128: the
    op's MMA kernel where its PTX runs, `kernels.paged_decode_fp8_mma`)."""
    p = fixed(kv_heads=2, head=head, seq_lens=[37, 20], num_splits=2, seed=5, spread=2.0)
    names = ("q", "k_cache", "v_cache", "block_table", "seq_lens", "scale", "k_scale", "v_scale")
    inputs = dict(zip(names, build_fp8(p), strict=True))
    del inputs["scale"]
    return inputs


CASES = {
    "quantize_mxfp4": (functools.partial(mxfp4.quantize_mxfp4, scale_mode="even"), lambda: {"x": _x(7, 96)}),
    "dequantize_mxfp4": (
        mxfp4.dequantize_mxfp4,
        lambda: dict(zip(("codes", "scales"), quantize_mxfp4(_x(7, 96)), strict=True)),
    ),
    "quantize_nvfp4": (_nvfp4_quantize, lambda: {"x": _x(7, 48)}),
    "dequantize_nvfp4": (
        _nvfp4_dequantize,
        lambda: {
            "codes": torch.randint(0, 256, (7, 24), dtype=torch.uint8),
            "scales": torch.randint(0, 127, (7, 3), dtype=torch.uint8),
        },
    ),
    "quantize_fp8 (per token)": (
        functools.partial(fp8_quant.quantize_fp8, granularity="token"),
        lambda: {"x": _x(7, 200)},
    ),
    "quantize_fp8 (groups of 128)": (
        functools.partial(fp8_quant.quantize_fp8, granularity="group", group_size=128),
        lambda: {"x": _x(7, 384)},
    ),
    "block_fp8_gemm": (functools.partial(block_fp8_gemm.block_fp8_gemm, out_dtype=torch.bfloat16), _block_fp8_inputs),
    "block_fp8_gemm (M > 64)": (  # the table's choice: on sm_90 the Gluon kernel's warp-specialized form
        functools.partial(block_fp8_gemm.block_fp8_gemm, out_dtype=torch.bfloat16),
        _block_fp8_wgmma_inputs,
    ),
    "block_fp8_gemm (M > 64, one partition)": (
        functools.partial(block_fp8_gemm.launch_block_fp8_gemm, config=block_fp8_gemm.WGMMA_CONFIG),
        _block_fp8_wgmma_inputs,
    ),
    "w4a16_mxfp4_gemm (gemv)": (w4a16_mxfp4_gemm.w4a16_mxfp4_gemm, lambda: _w4a16_inputs(1)),
    "w4a16_mxfp4_gemm (dot)": (w4a16_mxfp4_gemm.w4a16_mxfp4_gemm, lambda: _w4a16_inputs(17)),
    "w4a16_mxfp4_gemm_prepared (gemv)": (w4a16_mxfp4_gemm.w4a16_mxfp4_gemm_prepared, lambda: _w4a16_prepared_inputs(1)),
    "w4a16_mxfp4_gemm_prepared (dot)": (w4a16_mxfp4_gemm.w4a16_mxfp4_gemm_prepared, lambda: _w4a16_prepared_inputs(17)),
    "w4a16_nvfp4_gemm (one row)": (_w4a16_nvfp4, lambda: _w4a16_nvfp4_inputs(1)),
    "w4a16_nvfp4_gemm (17 rows)": (_w4a16_nvfp4, lambda: _w4a16_nvfp4_inputs(17)),
    "w4a16_mxfp4_fragment_gemv (one group)": (
        w4a16_mxfp4_fragment_gemv.w4a16_mxfp4_fragment_gemv,
        lambda: _fragment_inputs(1),
    ),
    "w4a16_mxfp4_fragment_gemv (two groups)": (
        w4a16_mxfp4_fragment_gemv.w4a16_mxfp4_fragment_gemv,
        lambda: _fragment_inputs(13),
    ),
    "w4a16_mxfp4_fragment_gemv (warp teams)": (
        _fragment_gemv_teams,
        lambda: _fragment_inputs(40),
    ),
    "w4a16_mxfp4_fragment_gemv (tiled)": (
        w4a16_mxfp4_fragment_gemv.w4a16_mxfp4_fragment_gemv,
        lambda: _fragment_inputs(w4a16_mxfp4_fragment_gemv.GEMV_MAX_M + 1),
    ),
    "dequantize_mxfp4_fragment": (
        mxfp4_fragment_dequantize.dequantize_mxfp4_fragment,
        lambda: {name: t for name, t in _fragment_inputs(1).items() if name != "x"},
    ),
    "dequantize_mxfp4_prepared": (
        mxfp4.dequantize_mxfp4_prepared,
        lambda: {name: t for name, t in _w4a16_prepared_inputs(1).items() if name != "x"},
    ),
    "rms_norm": (functools.partial(rms_norm.rms_norm, eps=1e-6), lambda: {"x": _x(5, 72), "weight": _x(1, 72)[0]}),
    "paged_decode (FP8 cache)": (
        functools.partial(paged_decode.paged_decode, scale=0.125, num_splits=2),
        _paged_decode_fp8_inputs,
    ),
    "paged_decode (FP8 cache, head 128)": (
        functools.partial(paged_decode.paged_decode, scale=0.125, num_splits=2),
        functools.partial(_paged_decode_fp8_inputs, 128),
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_guarded_call_agrees(name, device):
    call, inputs = CASES[name]
    assert_guarded_call_agrees(call, inputs(), device)


@pytest.mark.parametrize("m", [1, 17], ids=["gemv", "dot"])
def test_negative_control_scale_read_past_the_end_is_caught(m, device):
    faulty = functools.partial(w4a16_mxfp4_gemm.launch, fault="scale_past_end")
    with pytest.raises(AssertionError, match="bytes differ between zeroed and poisoned"):
        assert_guarded_call_agrees(faulty, _w4a16_inputs(m), device)


@pytest.mark.parametrize("m", [1, 17])
def test_negative_control_nvfp4_scale_read_past_the_end_is_caught(m, device):
    faulty = functools.partial(_w4a16_nvfp4, fault="scale_past_end")
    with pytest.raises(AssertionError, match="bytes differ between zeroed and poisoned"):
        assert_guarded_call_agrees(faulty, _w4a16_nvfp4_inputs(m), device)
