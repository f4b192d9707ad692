"""MXFP4 weights in `kernels.mxfp4_fragment_layout`'s prepared layout -> bf16 [N, K], in Triton: what
`reference.quant.mxfp4.dequantize_mxfp4` gives for the interchange codes and scales that
`mxfp4_fragment_layout.interchange` gives back, bit for bit (NaN payloads
aside: `kernels.tolerances.exact`).

Op: `touchstone::dequantize_mxfp4_fragment(words, pairs) -> bf16 [N, K]`; call it through
`dequantize_mxfp4_fragment` below. The runner's MXFP4 layers store only this layout where the fragment GEMV runs,
and prefill (many rows) multiplies the dequantized weights with cuBLAS, as it did from the interchange layout.

A program takes STEPS consecutive steps of one row tile: STEPS * 512 contiguous bytes of words, each word decoded
(`kernels._mxfp4_fragment_tiles.fragment_registers`) into the 8 consecutive weights of its row that it holds and
stored as 16 contiguous bytes.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels import mxfp4_fragment_layout as layout
from kernels._boundary import check_device, runs_interpreted
from kernels._mxfp4_fragment_tiles import fragment_registers, stacked_registers
from kernels._packed_ptx import packed_ptx
from kernels._pdl import launch_args, wait_then_release

# Planted bugs for the suite's negative control (constexpr FAULT; 0 compiles them away).
FAULTS = {"none": 0, "rows_swapped": 1}  # rows g and g + 8 of a tile stored in each other's place

# (STEPS, warps). Not swept: 8 steps (4 KiB of words, 8192 weights) a program at 4 warps is 8 words a thread, the
# shape of the interchange dequantizer's GPU row (`kernels.mxfp4`); reports/cuda-h200/mxfp4_dequantize.md has
# the bench of both.
GPU_CONFIG = (8, 4)
INTERPRETER_CONFIG = (8, 1)  # the interpreter runs programs one by one: few, large ones


@triton.jit
def _dequantize_fragment_kernel(
    words_ptr,
    pairs_ptr,
    out_ptr,
    n_steps,
    out_row_words,
    STEPS: tl.constexpr,
    PTX: tl.constexpr,
    FAULT: tl.constexpr,
    PDL: tl.constexpr,
):
    wait_then_release(PDL)  # kernels._pdl: before any read of an earlier kernel's output
    # out_ptr: int32 words of bf16 pairs [N, K / 2]; program (row tile, group of STEPS steps).
    tile, first = tl.program_id(0).to(tl.int64), tl.program_id(1) * STEPS
    i = tl.arange(0, STEPS * 128)  # (step, lane g c, word b h) of the program's words, in memory order
    step = first + i // 128
    live = step < n_steps
    lane, word = (i // 4) % 32, i % 4
    g, c, b, h = lane // 4, lane % 4, word // 2, word % 2
    chunk = tile * n_steps + tl.where(live, step, 0)
    words = tl.load(words_ptr + chunk * 128 + i % 128, mask=live, other=0)
    pairs = tl.load(pairs_ptr + (chunk * 8 + g) * 2 + b, mask=live, other=0)
    scale_bits = (pairs >> (16 * h)) & 0xFFFF
    r0, r1, r2, r3 = fragment_registers(words, scale_bits, PTX)
    regs = tl.reshape(stacked_registers(r0, r1, r2, r3), [STEPS * 128, 4])
    if FAULT == 1:
        h = 1 - h
    row = tile * 16 + 8 * h + g
    first_pair = row * out_row_words + ((2 * step + b) * 32 + 8 * c) // 2
    tl.store(out_ptr + first_pair[:, None] + tl.arange(0, 4)[None, :], regs, mask=live[:, None])


def launch(words: torch.Tensor, pairs: torch.Tensor, fault: str = "none") -> torch.Tensor:
    """Validate, allocate and launch; `fault` plants a named bug (negative controls)."""
    n, k = layout.check_weights(words, pairs)
    check_device(words=words, pairs=pairs)
    out = torch.empty(n, k, dtype=torch.bfloat16, device=words.device)
    if out.numel() == 0:
        return out
    steps, warps = INTERPRETER_CONFIG if runs_interpreted(words.device) else GPU_CONFIG
    n_steps = words.shape[1]
    _dequantize_fragment_kernel[(words.shape[0], triton.cdiv(n_steps, steps))](
        words, pairs, out.view(torch.int32), n_steps, k // 2,
        STEPS=steps, PTX=packed_ptx(words.device), FAULT=FAULTS[fault], num_warps=warps,
        **launch_args(words.device),
    )  # fmt: skip
    return out


@torch.library.custom_op("touchstone::dequantize_mxfp4_fragment", mutates_args=())
def _dequantize_op(words: torch.Tensor, pairs: torch.Tensor) -> torch.Tensor:
    return launch(words, pairs)


@_dequantize_op.register_fake
def _(words, pairs):
    n, k = layout.check_weights(words, pairs)
    return words.new_empty(n, k, dtype=torch.bfloat16)


def dequantize_mxfp4_fragment(words: torch.Tensor, pairs: torch.Tensor) -> torch.Tensor:
    """bf16 [N, K]: the weights of fragment-layout `words` and scale `pairs`, exactly."""
    return torch.ops.touchstone.dequantize_mxfp4_fragment(words, pairs)
