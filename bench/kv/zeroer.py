"""KV block zeroer benchmark: clear a random half of the blocks of a cache, against a memset of the same bytes.

Two geometries, one op each:
- `kv_zero_dsv4_packed`: DeepSeek-V4 packed cache (584 B entries, 64 a block, 576-aligned 37,440 B pages),
  4 layers side by side in each 149,760 B block row; a block clears 4 x 37,376 B (reference/kv/packed_mla.py).
- `kv_zero_fa_bf16`: FlashAttention's K/V-outermost bf16 cache, block 16, 8 KV heads x 128, 8 layers; a
  block clears 8 layers x (K 32 KiB + V 32 KiB) in 16 segments.
Bytes per call: the cleared bytes (stores only). Implementations: the pure-torch reference (one indexed
write per table row; the baseline every row is checked against), the Triton kernel (one launch), and
`memset`: `torch.Tensor.zero_` of a contiguous scratch of the same number of bytes (an ungated peer; the
bar: the kernel at >= 0.85x its GB/s on the H200). Each zeroer clears its own copy of the
canary-filled cache (copied untimed), so every impl's output is compared with the reference's. Every impl is
timed as a CUDA-graph replay, as an engine's captured step runs it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from bench.correctness import compare_exact
from bench.quant.sweeps import MIB, kernel, label, triton_skip
from bench.registry import Case, Impl, OpBench, register
from reference.kv.allocate import allocate_kv_cache
from reference.kv.attention import FullAttentionSpec
from reference.kv.packed_mla import DeepseekV4Spec
from reference.kv.spec import CacheSpec
from reference.kv.zeroer import zero_kv_blocks, zeroer_table

FULL_MIB = (1, 16, 64, 256, 1024)
SMALL_MIB = (1, 4)
CANARY = 0xA5


@dataclasses.dataclass(frozen=True)
class Geometry:
    spec: CacheSpec
    num_layers: int
    packed: bool

    @property
    def cleared_per_block(self) -> int:
        return self.num_layers * self.spec.real_page_bytes

    def cases(self, sizes: tuple[int, ...]) -> list[Case]:
        """Case shape (blocks cleared, blocks in the cache): half of the cache's blocks are cleared."""
        out = []
        for mib in sizes:
            ids = max(1, round(mib * MIB / self.cleared_per_block))
            out.append(Case(label(mib), float(mib), (ids, 2 * ids)))
        return out


@dataclasses.dataclass
class Inputs:
    buffers: list[torch.Tensor]
    table: torch.Tensor
    block_ids: torch.Tensor
    cleared: int


def make_inputs(geometry: Geometry):
    def inputs(case: Case, torch_device: str) -> Inputs:
        ids, num_blocks = case.shape
        cache = allocate_kv_cache(
            geometry.spec, num_blocks, geometry.num_layers, packed=geometry.packed, device=torch_device, fill=CANARY
        )
        table = zeroer_table({"attention": cache})
        order = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(0))[:ids]
        block_ids = order.to(device=torch_device, dtype=torch.int32)
        return Inputs(list(table.buffers), table.tensor(), block_ids, ids * geometry.cleared_per_block)

    return inputs


def zeroer(get_fn):
    def factory(inputs: Inputs):
        fn = get_fn()
        buffers = [b.clone() for b in inputs.buffers]  # untimed: each impl clears its own copy

        def call() -> torch.Tensor:
            fn(buffers, inputs.table, inputs.block_ids)
            return buffers[0]

        return call

    return factory


def memset(inputs: Inputs):
    scratch = torch.empty(inputs.cleared, dtype=torch.uint8, device=inputs.block_ids.device)
    return scratch.zero_


def check(out: Any, baseline: Any) -> str:
    """Zeroers: bit-exact against the reference's cache. The memset peer's scratch: every byte zero."""
    if out.shape == baseline.shape:
        return compare_exact(out, baseline)
    return "memset peer: scratch all zero" if not out.any() else "mismatch: memset left non-zero bytes"


def _op(name: str, geometry: Geometry, dtype: str) -> OpBench:
    return OpBench(
        name=name,
        area="kv",
        dtype=dtype,
        x_name="cleared_MiB",
        sweeps={"small": geometry.cases(SMALL_MIB), "full": geometry.cases(FULL_MIB)},
        make_inputs=make_inputs(geometry),
        impls=(
            Impl("reference-eager", zeroer(lambda: zero_kv_blocks)),
            Impl("triton", zeroer(lambda: kernel("kernels.kv_zeroer", "zero_kv_blocks")), triton_skip),
            Impl("memset", memset, gated=False),
        ),
        bytes_model=lambda case: case.shape[0] * geometry.cleared_per_block,
        flops_model=lambda case: 0,
        roof="memcpy",
        baselines=("reference-eager",),
        compare_to="memset",
        headline=(("triton", "memset"), ("triton", "memcpy")),
        check=check,
        # CUDA-graph replays (bench.timing.graphed says why): below 64 MiB a call is shorter than its host work,
        # which an engine's captured steps do not pay either
        cuda_graph=True,
    )


DSV4_PACKED = Geometry(DeepseekV4Spec(block_size=64), num_layers=4, packed=True)
FA_BF16 = Geometry(
    FullAttentionSpec(block_size=16, num_kv_heads=8, head_size=128, dtype=torch.bfloat16, kv_outer=True),
    num_layers=8,
    packed=False,
)
ZERO_DSV4 = register(_op("kv_zero_dsv4_packed", DSV4_PACKED, "uint8 (fp8_ds_mla V4)"))
ZERO_FA = register(_op("kv_zero_fa_bf16", FA_BF16, "bfloat16"))
