"""Tensor-parallel consistency of quantized weights: a rank that quantizes its shard of a weight must hold the
shard of the quantized full weight. That holds when no quantization block straddles a shard boundary, and a
per-tensor scale is the whole tensor's (given to every rank), never a shard's own.

`BLOCKS[scheme]` is the (rows, columns) a block spans (0: the whole dimension, one scale for it); a split
along `dim` into `parts` equal shards is refused when a shard's size is not a multiple of the block."""

from __future__ import annotations

# nvfp4: blocks of 16 along K, under a global scale that is the whole tensor's (like fp8's)
BLOCKS = {"fp8": (0, 0), "fp8_block": (128, 128), "mxfp4": (1, 32), "nvfp4": (1, 16)}


def check_tp_split(scheme: str, shape: tuple[int, int], dim: int, parts: int) -> int:
    """The shard size along `dim`; ValueError naming the weight's dim when a block would straddle two shards."""
    if scheme not in BLOCKS:
        raise ValueError(f"scheme: must be one of {sorted(BLOCKS)}, got {scheme!r}")
    if dim not in (0, 1):
        raise ValueError(f"dim: must be 0 (rows) or 1 (columns), got {dim}")
    if parts < 1 or shape[dim] % parts:
        raise ValueError(f"parts: {shape[dim]} along dim {dim} does not split into {parts} equal shards")
    size, block = shape[dim] // parts, BLOCKS[scheme][dim]
    if block and size % block:
        raise ValueError(
            f"weight: a {scheme} block spans {block} along dim {dim}; shards of {size} would split blocks between ranks"
        )
    return size
