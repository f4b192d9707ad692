"""Token -> expert alignment in Triton: `reference.moe.align`'s contract (sorted flat assignments padded per
expert to the grouped GEMM's row blocks, each block's expert, the padded row count), with no host
synchronization, so it runs inside CUDA graphs.

Op: `touchstone::moe_align_block_size(topk_ids, num_experts, block_size, expert_map) -> (sorted_token_ids,
expert_ids, num_tokens_post_padded)`; call it through `moe_align_block_size` below.

A counting sort, each program working on a vector of CHUNK assignments at once; four launches (after the
sentinel fill of sorted_token_ids):
1. `_count_kernel`, one program per CHUNK assignments: counts[p, e] for its chunk (its own row of a
   [programs, E] table; the column sums of the chunk's one-hot [CHUNK, E] matrix).
2. `_offsets_kernel`, one program: for each expert the exclusive prefix of counts over programs (written back
   in place: the program's first rank in the expert's run), the expert's total, its run padded to whole
   blocks, the runs' ends (inclusive cumsum over experts); num_tokens_post_padded = the padded sum.
3. `_scatter_kernel`, one program per chunk: assignment f of expert e lands at run start + its program's
   first rank + the number of assignments of e before it in the chunk (a [CHUNK, CHUNK] comparison), so every
   run is ascending in flat order, as the reference's.
4. `_blocks_kernel`: a block's expert is the first whose run ends after the block's first row (the number of
   runs ending at or before it), mapped through expert_map; blocks past num_tokens_post_padded get -1.
Up to CHUNK assignments (decode) all four steps run in one program, `_one_program_kernel`: one launch instead
of five, which are ~2 us apiece between a CUDA graph's kernels; the counts and run ends stay in registers.
Ids outside [0, E) are dropped (counted and scattered nowhere): checking values would need a host sync.
An expert map's values are checked on the host (one sync) except while a CUDA graph is being captured.
Launch sizes: CHUNK 128 on a GPU: a [128, 128] comparison per program and at most n / 128 rows of counts for
the one offsets program. The first version walked each chunk one assignment at a time (a dependent load and
store per step) and cost ~480 us of a 6.1 ms Mixtral-shaped layer at 4,096 tokens on the H200. 8 in the
interpreter, which runs programs one by one, so that small suite draws take both paths.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._boundary import check_device, runs_interpreted
from reference.moe.align import capacity, check_align_args, check_expert_map_values

GPU_CHUNK, INTERPRETER_CHUNK = 128, 8
PROGRAM_ROWS = 16  # rows of the counts table `_offsets_kernel` prefixes per step
BLOCKS = 64  # expert_ids entries a program of `_blocks_kernel` (or a step of `_one_program_kernel`) fills
FILL = 1024  # sorted_token_ids entries a step of `_one_program_kernel`'s sentinel fill writes

# Planted bugs for the suite's negative controls; FAULT is a constexpr, so fault 0 compiles them away.
FAULTS = {
    "none": 0,
    "padded_count_plus_one": 1,  # num_tokens_post_padded one row too many
    "neighbour_expert_block": 2,  # every block labelled with the next expert's id
}


@triton.jit
def _expert_of(ids_ptr, f, n, E):
    """Assignment f's expert; -1 past the end or out of [0, E) (dropped)."""
    e = tl.load(ids_ptr + f, mask=f < n, other=-1).to(tl.int32)
    return tl.where((e >= 0) & (e < E), e, -1)


@triton.jit
def _count_kernel(ids_ptr, counts_ptr, n, E, CHUNK: tl.constexpr, BLOCK_E: tl.constexpr):
    p = tl.program_id(0)
    e = _expert_of(ids_ptr, p * CHUNK + tl.arange(0, CHUNK), n, E)
    experts = tl.arange(0, BLOCK_E)
    counts = tl.sum((e[:, None] == experts[None, :]).to(tl.int32), axis=0)
    tl.store(counts_ptr + p * E + experts, counts, mask=experts < E)


@triton.jit
def _offsets_kernel(
    counts_ptr, ends_ptr, post_ptr, programs, E, block_size,
    BLOCK_E: tl.constexpr, ROWS: tl.constexpr, FAULT: tl.constexpr,
):  # fmt: skip
    e = tl.arange(0, BLOCK_E)
    live = e < E
    running = tl.zeros([BLOCK_E], tl.int32)
    for p0 in range(0, programs, ROWS):
        p = p0 + tl.arange(0, ROWS)
        ptrs = counts_ptr + p[:, None] * E + e[None, :]
        mask = (p[:, None] < programs) & live[None, :]
        c = tl.load(ptrs, mask=mask, other=0)
        tl.store(ptrs, tl.cumsum(c, 0) - c + running[None, :], mask=mask)
        running += tl.sum(c, 0)
    padded = (running + block_size - 1) // block_size * block_size
    tl.store(ends_ptr + e, tl.cumsum(padded, 0), mask=live)
    post = tl.sum(padded, 0)
    if FAULT == 1:
        post += 1
    tl.store(post_ptr, post)


@triton.jit
def _chunk_ranks(e, i):
    """Each assignment's rank among the chunk's assignments of its expert (the ones before it in flat order:
    a [CHUNK, CHUNK] comparison), so every run is ascending in flat order, as the reference's."""
    before = (e[:, None] == e[None, :]) & (i[None, :] < i[:, None])
    return tl.sum(before.to(tl.int32), axis=1)


@triton.jit
def _scatter_kernel(ids_ptr, counts_ptr, ends_ptr, sorted_ptr, n, E, CHUNK: tl.constexpr):
    p = tl.program_id(0)
    i = tl.arange(0, CHUNK)
    f = p * CHUNK + i
    e = _expert_of(ids_ptr, f, n, E)
    keep = e >= 0
    rank = _chunk_ranks(e, i) + tl.load(counts_ptr + p * E + e, mask=keep, other=0)
    start = tl.load(ends_ptr + e - 1, mask=keep & (e > 0), other=0)  # the previous expert's end
    tl.store(sorted_ptr + start + rank, f.to(tl.int32), mask=keep)


@triton.jit
def _block_experts(
    ends, post, map_ptr, expert_ids_ptr, b, num_blocks, E, block_size,
    HAS_MAP: tl.constexpr, BLOCK_E: tl.constexpr, FAULT: tl.constexpr,
):  # fmt: skip
    """expert_ids[b] for blocks `b`: the first expert whose run ends after the block's first row (the number of
    runs `ends` [BLOCK_E] ending at or before it), mapped through expert_map; -1 from row `post` on."""
    e = tl.arange(0, BLOCK_E)
    row = b * block_size
    ended = (ends[None, :] <= row[:, None]) & (e[None, :] < E)
    expert = tl.sum(ended.to(tl.int32), axis=1)
    used = row < post
    if FAULT == 2:
        expert = (expert + 1) % E
    if HAS_MAP:
        expert = tl.load(map_ptr + expert, mask=used & (expert < E), other=-1).to(tl.int32)
    tl.store(expert_ids_ptr + b, tl.where(used, expert, -1), mask=b < num_blocks)


@triton.jit
def _blocks_kernel(
    ends_ptr, post_ptr, map_ptr, expert_ids_ptr, num_blocks, E, block_size,
    HAS_MAP: tl.constexpr, BLOCK_E: tl.constexpr, BLOCKS: tl.constexpr, FAULT: tl.constexpr,
):  # fmt: skip
    e = tl.arange(0, BLOCK_E)
    ends = tl.load(ends_ptr + e, mask=e < E, other=0)
    b = tl.program_id(0) * BLOCKS + tl.arange(0, BLOCKS)
    _block_experts(
        ends, tl.load(post_ptr), map_ptr, expert_ids_ptr, b, num_blocks, E, block_size, HAS_MAP, BLOCK_E, FAULT
    )


@triton.jit
def _one_program_kernel(
    ids_ptr, starts_ptr, sorted_ptr, post_ptr, map_ptr, expert_ids_ptr, n, E, block_size, cap, num_blocks,
    CHUNK: tl.constexpr, BLOCK_E: tl.constexpr, HAS_MAP: tl.constexpr, BLOCKS: tl.constexpr,
    FILL: tl.constexpr, FAULT: tl.constexpr,
):  # fmt: skip
    """All four steps for n <= CHUNK assignments in one program: the counts, the padded runs and their ends
    in registers, the sentinel written over the whole sorted array, then (after a barrier, so no sentinel
    lands on a placed assignment) each assignment at its run's start (`starts_ptr`, E entries written and
    read back across the barrier) plus its rank, and the blocks' experts."""
    i = tl.arange(0, CHUNK)
    e = _expert_of(ids_ptr, i, n, E)
    keep = e >= 0
    experts = tl.arange(0, BLOCK_E)
    counts = tl.sum((e[:, None] == experts[None, :]).to(tl.int32), axis=0)
    padded = (counts + block_size - 1) // block_size * block_size
    ends = tl.cumsum(padded, 0)
    post = tl.sum(padded, 0)
    if FAULT == 1:
        post += 1
    tl.store(post_ptr, post)
    tl.store(starts_ptr + experts, ends - padded, mask=experts < E)
    for r0 in range(0, cap, FILL):
        r = r0 + tl.arange(0, FILL)
        tl.store(sorted_ptr + r, tl.full([FILL], 0, tl.int32) + n, mask=r < cap)
    tl.debug_barrier()
    start = tl.load(starts_ptr + e, mask=keep, other=0)
    tl.store(sorted_ptr + start + _chunk_ranks(e, i), i, mask=keep)
    for b0 in range(0, num_blocks, BLOCKS):
        b = b0 + tl.arange(0, BLOCKS)
        _block_experts(ends, post, map_ptr, expert_ids_ptr, b, num_blocks, E, block_size, HAS_MAP, BLOCK_E, FAULT)


def check_moe_align_args(topk_ids, num_experts: int, block_size: int, expert_map) -> None:
    """The reference's checks without reading values (no host sync), and the kernel's int32 expert map."""
    check_align_args(topk_ids, num_experts, block_size, expert_map, values=False)
    if expert_map is not None and expert_map.dtype != torch.int32:
        raise ValueError(f"expert_map: the kernel reads int32, got {expert_map.dtype}")


def launch(topk_ids, num_experts: int, block_size: int, expert_map=None, fault: str = "none"):
    """Validate, allocate and launch; returns (sorted_token_ids, expert_ids, num_tokens_post_padded)."""
    check_moe_align_args(topk_ids, num_experts, block_size, expert_map)
    device = (
        check_device(topk_ids=topk_ids)
        if expert_map is None
        else check_device(topk_ids=topk_ids, expert_map=expert_map)
    )
    if expert_map is not None and not (expert_map.is_cuda and torch.cuda.is_current_stream_capturing()):
        check_expert_map_values(expert_map, num_experts)
    ids = topk_ids.reshape(-1).contiguous()
    n = ids.numel()
    cap = capacity(n, num_experts, block_size)
    chunk = INTERPRETER_CHUNK if runs_interpreted(device) else GPU_CHUNK
    programs = max(1, triton.cdiv(n, chunk))
    expert_ids = torch.empty(cap // block_size, dtype=torch.int32, device=device)
    post = torch.empty(1, dtype=torch.int32, device=device)
    ends = torch.empty(num_experts, dtype=torch.int32, device=device)
    block_e = triton.next_power_of_2(num_experts)
    code = FAULTS[fault]
    mapping = expert_map if expert_map is not None else ends  # any int32 pointer when HAS_MAP is off
    if programs == 1:  # decode: one launch instead of five (the sentinel fill included)
        sorted_ids = torch.empty(cap, dtype=torch.int32, device=device)
        _one_program_kernel[(1,)](
            ids, ends, sorted_ids, post, mapping, expert_ids, n, num_experts, block_size, cap, expert_ids.numel(),
            CHUNK=chunk, BLOCK_E=block_e, HAS_MAP=expert_map is not None, BLOCKS=BLOCKS, FILL=FILL, FAULT=code,
            num_warps=8,
        )  # fmt: skip
        return sorted_ids, expert_ids, post
    sorted_ids = torch.full((cap,), n, dtype=torch.int32, device=device)
    counts = torch.empty(programs, num_experts, dtype=torch.int32, device=device)
    _count_kernel[(programs,)](ids, counts, n, num_experts, CHUNK=chunk, BLOCK_E=block_e, num_warps=8)
    _offsets_kernel[(1,)](
        counts, ends, post, programs, num_experts, block_size, BLOCK_E=block_e, ROWS=PROGRAM_ROWS, FAULT=code
    )
    _scatter_kernel[(programs,)](ids, counts, ends, sorted_ids, n, num_experts, CHUNK=chunk, num_warps=8)
    if expert_ids.numel():
        _blocks_kernel[(triton.cdiv(expert_ids.numel(), BLOCKS),)](
            ends, post, mapping, expert_ids, expert_ids.numel(), num_experts, block_size,
            HAS_MAP=expert_map is not None, BLOCK_E=block_e, BLOCKS=BLOCKS, FAULT=code,
        )  # fmt: skip
    return sorted_ids, expert_ids, post


@torch.library.custom_op("touchstone::moe_align_block_size", mutates_args=())
def _align_op(
    topk_ids: torch.Tensor, num_experts: int, block_size: int, expert_map: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return launch(topk_ids, num_experts, block_size, expert_map)


@_align_op.register_fake
def _(topk_ids, num_experts, block_size, expert_map):
    check_moe_align_args(topk_ids, num_experts, block_size, expert_map)
    cap = capacity(topk_ids.numel(), num_experts, block_size)
    new = topk_ids.new_empty
    return new(cap, dtype=torch.int32), new(cap // block_size, dtype=torch.int32), new(1, dtype=torch.int32)


def moe_align_block_size(topk_ids: torch.Tensor, num_experts: int, block_size: int, expert_map=None):
    """Kernel twin of `reference.moe.align.align_block_size` (its three tensors, as a tuple)."""
    return torch.ops.touchstone.moe_align_block_size(topk_ids, num_experts, block_size, expert_map)
