"""Split-K, shared by the GEMMs that split K (W4A16 MXFP4, block FP8): how many splits (`fill_splits` on the GPU's
`sm_count`, `launch_split`), and its second half, the fp32 partials [SPLIT_K, M, N] added in split order and rounded
once to the output's dtype, in one kernel.

Deterministic: the order of the sum is the split order, never an atomic's arrival order. One launch where
`out.copy_(partials.sum(0))` takes two (a reduction and a cast): on the H200, Llama-3.1-8B's block-FP8 decode
step at batch 1 spent 289 us in 95 torch sums and 99 us in 95 casts (`torch.profiler`, CUDA-graph decode).

A sum inside the GEMM (the last split to finish adds the partials, behind an atomic counter per tile) was
tried and dropped: on the H200 it made the W4A16 dot kernel slower at M = 8 (gate_up 78.8 against 64.9 us
with this kernel) and gave wrong block-FP8 results on the first launches of a new shape, not understood.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from kernels._boundary import runs_interpreted

BLOCK = 1024
# The interpreter runs programs one by one: a grid sized for it is a few programs (a persistent one still walks
# several tiles each).
INTERPRETED_SMS = 4


@triton.jit
def _split_k_sum_kernel(partial_ptr, out_ptr, numel, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr):
    """out = round(sum over splits of the fp32 partials, added in split order)."""
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < numel
    total = tl.load(partial_ptr + offsets, mask=mask, other=0.0)
    for split in tl.static_range(1, SPLIT_K):
        total += tl.load(partial_ptr + split * numel + offsets, mask=mask, other=0.0)
    tl.store(out_ptr + offsets, total.to(out_ptr.dtype.element_ty), mask=mask)


@functools.cache
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def sm_count(device: torch.device) -> int:
    """The GPU's SM count (its multiprocessors: one resident program each is what a split-K grid aims at); under
    the interpreter INTERPRETED_SMS."""
    if runs_interpreted(device):
        return INTERPRETED_SMS
    return _sm_count(device.index if device.index is not None else torch.cuda.current_device())


def fill_splits(tiles: int, sms: int, most: int) -> int:
    """Enough K splits to give each of `sms` SMs a program over `tiles` output tiles, within 1 .. `most`."""
    return max(1, min(sms // max(tiles, 1), most))


def launch_split(k_tiles: int, split_k: int) -> tuple[int, int]:
    """(splits, K tiles per split) for `split_k` requested over `k_tiles`: at least one tile a split and no
    empty split."""
    split = max(1, min(split_k, k_tiles))
    per_split = triton.cdiv(k_tiles, split)
    return triton.cdiv(k_tiles, per_split), per_split


def sum_splits(partials: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """out (contiguous [M, N]) = the contiguous fp32 partials [SPLIT_K, M, N] added in split order, rounded
    once to out's dtype."""
    numel = out.numel()
    if numel:
        _split_k_sum_kernel[(triton.cdiv(numel, BLOCK),)](partials, out, numel, SPLIT_K=partials.shape[0], BLOCK=BLOCK)
    return out
