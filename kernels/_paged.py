"""What the paged attention launchers (kernels/paged_decode.py, kernels/paged_prefill.py) share on the host:
the planted-fault names, the exp2-domain constant, tl.dot's smallest tile, and the launch-boundary checks
beyond `reference.attention.paged.check_paged_args`; and what the split-K decode kernels share on the device
(`split_of_program`)."""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kernels._boundary import check_device

# Planted bugs for the suites' negative controls; FAULT is a constexpr, so fault 0 compiles it away.
FAULTS = {
    "none": 0,
    "block_table_off_by_one": 1,  # logical block j read through block_table[b, j + 1]
}
LOG2E = math.log2(math.e)
MIN_DOT = 16  # tl.dot's smallest M, N and K


def check_launch(q: torch.Tensor, **others: torch.Tensor) -> torch.device:
    """q's last dim contiguous (the kernels step d by 1), the 1-D length tensors contiguous (the kernels read
    entry b at ptr + b), then every tensor on one device, which is returned."""
    if q.stride(-1) != 1 and q.shape[-1] > 1:
        raise ValueError(f"q: last dim must have stride 1, got strides {q.stride()}")
    for name in ("seq_lens", "cu_seqlens"):
        t = others.get(name)
        if t is not None and t.shape[0] > 1 and t.stride(0) != 1:
            raise ValueError(f"{name}: must be contiguous, got stride {t.stride()}")
    return check_device(q=q, **others)


@triton.jit
def split_of_program(seq_lens_ptr, num_splits, BLOCK_SIZE: tl.constexpr):
    """(seq (int64), kv_head, split, length, first, last) of a program of the split-K decode grid (B, Hkv,
    num_splits): its sequence's length and its range [first, last) of whole cache blocks, the reference's
    `split_blocks` computed on the device."""
    seq = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    length = tl.load(seq_lens_ptr + seq)
    num_blocks = tl.cdiv(length, BLOCK_SIZE)
    per_split = tl.cdiv(num_blocks, num_splits)
    first = tl.minimum(split * per_split, num_blocks)
    last = tl.minimum(first + per_split, num_blocks)
    return seq, kv_head, split, length, first, last
