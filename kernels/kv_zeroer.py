"""KV block zeroer in Triton: one launch clears the given blocks of every row of a segment table
(`reference.kv.zeroer`), byte-exact with `reference.kv.zeroer.zero_kv_blocks`.

Op: `touchstone::zero_kv_blocks(buffers, table, block_ids) -> ()`, mutating `buffers`; call it through
`zero_kv_blocks`, which has the reference's signature.

The host turns the table (int64 [rows, 5] on the CPU: buffer, offset, block_stride, nbytes, num_blocks) into
a device table of words, each row's start counted from the lowest-addressed buffer, so segments of many
allocations are cleared by one launch through one base pointer (vLLM keeps absolute addresses; a pointer
plus an offset is the same address and keeps every buffer a tensor argument torch sees mutated). The word is
the widest of 1, 2, 4 bytes dividing every start, stride and length, and VEC words (up to 16 bytes) are
promised aligned, so 16-byte-aligned tables get 128-bit stores. The device table is cached per (rows,
addresses, device): a steady state of calls with the same caches copies nothing to the device.

Grid: (block id x chunk, row). Program (i * n_chunks + c, r) clears words [c * CHUNK, (c + 1) * CHUNK) of
row r's segment of block `block_ids[i]`, masked to the row's length: rows of different lengths share the
grid, a short row's extra chunks store nothing. A block id outside [0, num_blocks) of a row stores nothing
(checking it on the host would cost a device sync per call; the reference raises instead).
"""

from __future__ import annotations

import collections
import functools
import math

import torch
import triton
import triton.language as tl

from kernels._boundary import check_device, runs_interpreted
from reference.kv.zeroer import check_zero_kv_blocks_args, table_rows

# Planted bugs for the suite's negative controls; FAULT is a constexpr, so fault 0 compiles them away.
FAULTS = {
    "none": 0,
    # The conflation vLLM PR #50276 fixed: one number for stride and span. The bytes a block clears (its page) are
    # used as the block-to-block stride, so in a packed row block b + 1 lands on the next layer's block b.
    "page_as_stride": 1,
}

# Launch shape: bytes one program clears and its warps: 8 KiB a program is 64 B (four 16-byte stores) per
# thread at 4 warps. H200 (`python -m bench.kv.zeroer_launch_sweep`, 1 GiB cleared, half the blocks in random
# order): 4036 GB/s on DeepSeek-V4 packed rows, 4283 GB/s on FA bf16 K/V = 1.20x / 1.27x torch's zero_ of as
# many bytes, 0.95x / 1.01x memcpy. 2 KiB programs drop to 0.96x / 1.00x memset; 4-32 KiB at 1-8 warps are
# within 1 % of this on FA rows and within 10 % on the DSV4 rows (2 warps the worst there); 8 warps at 2-4 KiB
# lose 13-30 %.
GPU_LAUNCH = {"chunk_bytes": 8192, "num_warps": 4}
# The interpreter costs ~1 ms per program whatever its size: one program per segment.
INTERPRETER_LAUNCH = {"chunk_bytes": 1 << 20, "num_warps": 1}
MAX_ALIGN = 16  # bytes: the widest store (st.global.v4.b32)
MAX_ROWS = 65535  # grid axis 1
PLAN_CACHE_SIZE = 64  # (table, caches) pairs: an engine has one, a test run a few dozen
_PLANS: collections.OrderedDict = collections.OrderedDict()  # plan key -> (base index, words, word, vec)


@triton.jit
def _zero_kv_blocks_kernel(
    base_ptr,
    table_ptr,
    block_ids_ptr,
    n_chunks,
    WORD: tl.constexpr,
    VEC: tl.constexpr,
    CHUNK: tl.constexpr,
    FAULT: tl.constexpr,
):
    pid = tl.program_id(0)
    row = tl.program_id(1).to(tl.int64)
    i = pid // n_chunks
    chunk = pid - i * n_chunks
    block = tl.load(block_ids_ptr + i).to(tl.int64)
    start = tl.load(table_ptr + row * 4)
    stride = tl.load(table_ptr + row * 4 + 1)
    nwords = tl.multiple_of(tl.load(table_ptr + row * 4 + 2), VEC)
    num_blocks = tl.load(table_ptr + row * 4 + 3)
    if FAULT == 1:
        stride = nwords
    first = tl.multiple_of(start + block * stride, VEC)
    cols = chunk.to(tl.int64) * CHUNK + tl.arange(0, CHUNK)
    mask = (cols < nwords) & (block >= 0) & (block < num_blocks)
    if WORD == 4:
        ptr = base_ptr.to(tl.pointer_type(tl.int32))
        tl.store(ptr + first + cols, tl.zeros([CHUNK], dtype=tl.int32), mask=mask)
    elif WORD == 2:
        ptr = base_ptr.to(tl.pointer_type(tl.int16))
        tl.store(ptr + first + cols, tl.zeros([CHUNK], dtype=tl.int16), mask=mask)
    else:
        tl.store(base_ptr + first + cols, tl.zeros([CHUNK], dtype=tl.uint8), mask=mask)


@functools.lru_cache(maxsize=32)
def _device_table(rows: tuple[tuple[int, int, int, int], ...], device: torch.device) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.int64, device=device).reshape(len(rows), 4)


def plan(buffers, table):
    """(base buffer, word rows (start, stride, nwords, num_blocks), word bytes, words per aligned vector),
    cached per (table contents, buffer addresses and sizes): an engine clears blocks of the same caches with
    the same table every step, and planning (checking every row against its buffer, the alignment) is host
    work of the order of the kernel itself at small sizes."""
    key = (table.numpy().tobytes(), tuple(table.shape), tuple((b.data_ptr(), b.numel()) for b in buffers))
    cached = _PLANS.get(key)
    if cached is None:
        cached = _plan(buffers, table)
        _PLANS[key] = cached
        if len(_PLANS) > PLAN_CACHE_SIZE:
            _PLANS.popitem(last=False)
    else:
        _PLANS.move_to_end(key)
    base, words, word, vec = cached
    return buffers[base], words, word, vec


def _plan(buffers, table) -> tuple[int, tuple, int, int]:
    rows = table_rows(buffers, table)
    if len(rows) > MAX_ROWS:
        raise ValueError(f"table: {len(rows)} rows, the launch grid holds at most {MAX_ROWS}")
    addresses = [b.data_ptr() for b in buffers]
    base = min(range(len(buffers)), key=addresses.__getitem__)
    starts = [addresses[r.buffer] - addresses[base] + r.offset for r in rows]
    align = math.gcd(MAX_ALIGN, addresses[base], *starts, *(r.block_stride for r in rows), *(r.nbytes for r in rows))
    word = min(align, 4)
    words = tuple(
        (s // word, r.block_stride // word, r.nbytes // word, r.num_blocks) for s, r in zip(starts, rows, strict=True)
    )
    return base, words, word, align // word


def launch_zero_kv_blocks(buffers, table, block_ids, fault="none", chunk_bytes=None, num_warps=None):
    """Validate and launch; `fault` plants a named bug (negative controls only); `chunk_bytes`/`num_warps`
    override the launch shape (the launch sweep)."""
    check_zero_kv_blocks_args(buffers, table, block_ids)
    device = check_device(block_ids=block_ids, **{f"buffers[{i}]": b for i, b in enumerate(buffers)})
    block_ids = block_ids.contiguous()  # the kernel reads id i at block_ids_ptr + i (a slice may stride)
    base, words, word, vec = plan(buffers, table)
    if block_ids.numel() == 0 or not words:
        return
    launch = INTERPRETER_LAUNCH if runs_interpreted(device) else GPU_LAUNCH
    chunk_bytes = chunk_bytes or launch["chunk_bytes"]
    max_words = max(w[2] for w in words)
    chunk = min(triton.next_power_of_2(max_words), max(1, chunk_bytes // word))
    n_chunks = triton.cdiv(max_words, chunk)
    if block_ids.numel() * n_chunks >= 2**31:
        raise ValueError(f"block_ids: {block_ids.numel()} blocks x {n_chunks} chunks overflow the launch grid")
    _zero_kv_blocks_kernel[(block_ids.numel() * n_chunks, len(words))](
        base,
        _device_table(words, device),
        block_ids,
        n_chunks,
        WORD=word,
        VEC=vec,
        CHUNK=chunk,
        FAULT=FAULTS[fault],
        num_warps=num_warps or launch["num_warps"],
    )


@torch.library.custom_op("touchstone::zero_kv_blocks", mutates_args=("buffers",))
def _zero_kv_blocks_op(buffers: list[torch.Tensor], table: torch.Tensor, block_ids: torch.Tensor) -> None:
    launch_zero_kv_blocks(buffers, table, block_ids)


@_zero_kv_blocks_op.register_fake
def _(buffers, table, block_ids):
    check_zero_kv_blocks_args(buffers, table, block_ids)


def zero_kv_blocks(buffers: list[torch.Tensor], table: torch.Tensor, block_ids: torch.Tensor) -> None:
    """Kernel twin of `reference.kv.zeroer.zero_kv_blocks` (same arguments, same bytes)."""
    torch.ops.touchstone.zero_kv_blocks(list(buffers), table, block_ids)
