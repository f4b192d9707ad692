"""Paged decode benchmark: one new token a sequence attends to its whole paged context.

32 query heads, 8 KV heads, head 128, bf16, block size 16 (bench/attention/paged_decode_inputs.py builds the
problems: random-permutation block tables, every sequence `context` long). Two ops, one per report x axis:
- `paged_decode_ctx4096`: x = batch 1 .. 256 at context 4096 (the bar: batch 128 >= 0.92x SDPA on
  contiguous KV, and faster than FlexAttention paged);
- `paged_decode_batch8`: x = context 512 .. 32k at batch 8 (the split-K path; bar at 32k >= 0.85x memcpy).
Bytes per call (compulsory): K and V of every token (2 x batch x context x 8 x 128 x 2) + q + out; FLOPs
4 x batch x 32 x context x 128 (q k^T and p v). Roof: the same-run memcpy. Implementations:
- reference-mirror: reference.attention.paged.paged_decode_mirror with the kernel's split count (the
  baseline; a Python loop over sequences, so it syncs with the host and is timed without a CUDA graph);
- triton: kernels.paged_decode, num_splits from paged_decode_inputs.num_splits_for;
- sdpa-contiguous (ungated peer): torch SDPA, enable_gqa=True, on the same K/V gathered once (untimed) into
  contiguous [B, 8, context, 128]: the no-paging ceiling;
- flex-paged (ungated peer): FlexAttention's paged attention (torch.nn.attention.experimental.
  _paged_attention) reading the same cache bytes as a [1, 8, tokens, 128] view with page size 16, its page
  table the same block table; compiled on the GPU, eager on the CPU (the CPU run checks the construction).
Correctness: lossy against the mirror, kernels.tolerances row "paged_decode". Timing: CUDA-graph replays
(`cuda_graph=True`: a batch-1 decode runs for a few microseconds, less than the host's op dispatch).

A third op, `paged_decode_fp8_ctx4096`, runs the batch sweep over an FP8 cache: the same K/V stored through the
FP8 store reference (e4m3fn codes, one fp32 scale per slot and KV head; paged_decode_inputs.fp8_kv). Bytes:
the codes and scales of every token (the bar: batch 128 >= 0.85x memcpy). Its mirror and kernel take the FP8
cache (on NVIDIA sm_90+ the op's FP8 split kernel is kernels.paged_decode_fp8_mma); triton-generic is the op's
generic split kernel on the same cache (`mma=False`); the ungated peer triton-bf16-cache is the op on the bf16
cache the codes came from (what the FP8 cache replaces: it reads twice the bytes), checked as an expected
difference (the quantization).
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from collections.abc import Callable

import torch

from bench.attention import paged_decode_inputs as pdi
from bench.correctness import expected_difference, lossy_check
from bench.quant.sweeps import kernel, triton_skip
from bench.registry import Case, Impl, OpBench, Unavailable, register
from kernels.tolerances import families
from reference.attention.paged import paged_decode_mirror

FULL_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
FULL_CONTEXTS = (512, 1024, 2048, 4096, 8192, 16384, 32768)
BATCH_OP_CONTEXT, CONTEXT_OP_BATCH = 4096, 8
# CPU: the harness only (the eager mirror and peers take milliseconds at these sizes).
SMALL_BATCHES, SMALL_BATCH_CONTEXT = (1, 2), 64
SMALL_CONTEXTS, SMALL_CONTEXT_BATCH = (32, 64), 2
# The mirror materialises K and V repeated to 32 heads in fp32, ~0.5 KiB x 32 per token of a sequence
# (~4 GiB at 256k tokens); it runs on the CPU only where a few seconds suffice.
MIRROR_GPU_MAX_CONTEXT = 1 << 18
MIRROR_CPU_MAX_TOKENS = 1 << 16


def _case(batch: int, context: int, x_value: int) -> Case:
    return Case(f"B{batch}_L{context}", float(x_value), (batch, context))


def problem_bytes(case: Case) -> int:
    batch, context = case.shape
    return pdi.kv_bytes(batch, context) + 2 * batch * pdi.HQ * pdi.HEAD * 2  # + q and out, bf16


def problem_flops(case: Case) -> int:
    batch, context = case.shape
    return 4 * batch * pdi.HQ * context * pdi.HEAD


def inputs(case: Case, torch_device: str) -> pdi.Problem:
    return pdi.make_problem(*case.shape, torch_device)


def mirror_skip(case: Case, backend: str) -> str | None:
    batch, context = case.shape
    if backend == "cpu" and batch * context > MIRROR_CPU_MAX_TOKENS:
        return f"the eager mirror over {batch * context} tokens takes minutes on the CPU (cap {MIRROR_CPU_MAX_TOKENS})"
    if context > MIRROR_GPU_MAX_CONTEXT:
        need = context * pdi.HQ * pdi.HEAD * 4 * 2
        return f"the mirror's per-sequence fp32 K/V over 32 heads would take {need / 2**30:.0f} GiB"
    return None


def _mirror(p: pdi.Problem) -> Callable[[], torch.Tensor]:
    return lambda: paged_decode_mirror(*p.args)


def _triton(p: pdi.Problem) -> Callable[[], torch.Tensor]:
    fn = kernel("kernels.paged_decode", "paged_decode")
    return lambda: fn(p.q, p.k_cache, p.v_cache, p.block_table, p.seq_lens, scale=p.scale, num_splits=p.num_splits)


def _sdpa(p: pdi.Problem) -> Callable[[], torch.Tensor]:
    k, v = pdi.contiguous_kv(p)
    q4 = p.q[:, :, None, :]
    sdpa = torch.nn.functional.scaled_dot_product_attention
    return lambda: sdpa(q4, k, v, scale=p.scale, enable_gqa=True)[:, :, 0, :]


@functools.cache
def _flex_fn(device_type: str) -> Callable:
    from torch.nn.attention.flex_attention import flex_attention

    if device_type == "cpu":
        # Unfused (materialises the scores): it checks the paging construction, not the speed; so say so
        # in the docstring, not in a warning on every CPU run.
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        return flex_attention
    # One static graph per shape: the decode kernel (flex_decoding) needs static batch and heads. The sweeps
    # hold 16 shapes, over dynamo's default recompile limit of 8 (past it, flex would fall back to eager).
    import torch._dynamo.config as dynamo_config

    dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, 64)
    return torch.compile(flex_attention, dynamic=False)


def _flex_paged(p: pdi.Problem) -> Callable[[], torch.Tensor]:
    try:
        from torch.nn.attention.experimental._paged_attention import PagedAttention
        from torch.nn.attention.flex_attention import create_block_mask, noop_mask
    except ImportError as err:
        raise Unavailable(
            f"FlexAttention paged attention is not importable in torch {torch.__version__} "
            f"({type(err).__name__}: {err})"
        ) from err
    batch, max_blocks = p.block_table.shape
    num_blocks, block = p.k_cache.shape[:2]
    device = p.q.device
    # Flex's paged cache is [1, Hkv, num_pages * page_size, D], token t in page t // page_size: our K/V-
    # outermost NHD planes viewed as such (same bytes, no copy), page size = the cache block size.
    k, v = (c.flatten(0, 1).transpose(0, 1)[None] for c in (p.k_cache, p.v_cache))
    if k.untyped_storage().data_ptr() != p.k_cache.untyped_storage().data_ptr():
        raise AssertionError("flex-paged: the K view must share the cache's storage")
    paged = PagedAttention(num_blocks, block, batch, device=str(device))
    # The page table is the block table; reserve() would allocate pages of its own, so set both maps.
    logical = torch.arange(max_blocks, device=device)
    paged.page_table[:, :max_blocks] = p.block_table.long()
    paged.physical_to_logical[torch.arange(batch, device=device)[:, None], p.block_table.long()] = logical
    # Every sequence fills its blocks (context % 16 == 0): noop_mask makes every block full, so neither
    # mask_mod nor a score_mod runs per score. Q block 128 (the default; the decode kernel needs it to be a
    # multiple of its BLOCK_M), KV block = the page size, as convert_logical_block_mask requires.
    context = max_blocks * block
    logical_mask = create_block_mask(noop_mask, batch, None, 1, context, device=str(device), BLOCK_SIZE=(128, block))
    mask = paged.convert_logical_block_mask(logical_mask)
    q4 = p.q[:, :, None, :]
    flex = _flex_fn(device.type)
    return lambda: flex(q4, k, v, block_mask=mask, scale=p.scale, enable_gqa=True)[:, :, 0, :]


@dataclasses.dataclass(frozen=True)
class Fp8Problem:
    """A problem with its K/V also in an FP8 cache: `bf16` the problem, `args` the FP8 decode's arguments."""

    bf16: pdi.Problem
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    k_scale: torch.Tensor
    v_scale: torch.Tensor

    @property
    def args(self) -> tuple:
        p = self.bf16
        return (
            p.q,
            self.k_cache,
            self.v_cache,
            p.block_table,
            p.seq_lens,
            p.scale,
            p.num_splits,
            self.k_scale,
            self.v_scale,
        )


def fp8_inputs(case: Case, torch_device: str) -> Fp8Problem:
    problem = inputs(case, torch_device)
    return Fp8Problem(problem, *pdi.fp8_kv(problem))


def fp8_problem_bytes(case: Case) -> int:
    batch, context = case.shape
    return pdi.fp8_kv_bytes(batch, context) + 2 * batch * pdi.HQ * pdi.HEAD * 2  # + q and out, bf16


def _fp8_mirror(p: Fp8Problem) -> Callable[[], torch.Tensor]:
    return lambda: paged_decode_mirror(*p.args)


def _fp8_triton(p: Fp8Problem) -> Callable[[], torch.Tensor]:
    fn = kernel("kernels.paged_decode", "paged_decode")
    q, k_cache, v_cache, table, lens, scale, splits, k_scale, v_scale = p.args
    return lambda: fn(
        q, k_cache, v_cache, table, lens, scale=scale, num_splits=splits, k_scale=k_scale, v_scale=v_scale
    )


def _fp8_generic(p: Fp8Problem) -> Callable[[], torch.Tensor]:
    """The generic split kernel on the same FP8 cache (`mma=False`), where the op takes the MMA kernel."""
    launch = kernel("kernels.paged_decode", "launch_paged_decode")
    return lambda: launch(*p.args, mma=False)


# The bf16 cache against the FP8 mirror: e4m3's 3 mantissa bits on K and V move the output by up to ~1/8 of
# its peak (measured max_rel 0.05 on these random-normal problems).
BF16_CACHE_CHECK = expected_difference("the bf16 cache the FP8 codes were quantized from", 0.25)

FP8_IMPLS = (
    Impl("reference-mirror", _fp8_mirror, mirror_skip),
    Impl("triton", _fp8_triton, triton_skip),
    Impl("triton-generic", _fp8_generic, triton_skip),
    Impl("triton-bf16-cache", lambda p: _triton(p.bf16), triton_skip, gated=False, check=BF16_CACHE_CHECK),
)

IMPLS = (
    Impl("reference-mirror", _mirror, mirror_skip),
    Impl("triton", _triton, triton_skip),
    Impl("sdpa-contiguous", _sdpa, gated=False),
    Impl("flex-paged", _flex_paged, gated=False),
)


def _op(name: str, x_name: str, full: list[Case], small: list[Case], fp8: bool = False) -> OpBench:
    if fp8:
        compare_to = "triton-bf16-cache"
        headline = (("triton", "memcpy"), ("triton", "triton-generic"), ("triton", "triton-bf16-cache"))
    else:
        compare_to = "sdpa-contiguous"
        headline = (("triton", "sdpa-contiguous"), ("triton", "flex-paged"), ("triton", "memcpy"))
    return OpBench(
        name=name,
        area="attention",
        dtype="e4m3fn cache, bf16 q" if fp8 else "bfloat16",
        x_name=x_name,
        sweeps={"small": small, "full": full},
        make_inputs=fp8_inputs if fp8 else inputs,
        impls=FP8_IMPLS if fp8 else IMPLS,
        bytes_model=fp8_problem_bytes if fp8 else problem_bytes,
        flops_model=problem_flops,
        roof="memcpy",
        baselines=("reference-mirror",),
        compare_to=compare_to,
        headline=headline,
        check=lossy_check(families.PAGED_DECODE),
        cuda_graph=True,
    )


_BATCH_FULL = [_case(b, BATCH_OP_CONTEXT, b) for b in FULL_BATCHES]
_BATCH_SMALL = [_case(b, SMALL_BATCH_CONTEXT, b) for b in SMALL_BATCHES]
BATCH_OP = register(_op(f"paged_decode_ctx{BATCH_OP_CONTEXT}", "batch", _BATCH_FULL, _BATCH_SMALL))
CONTEXT_OP = register(
    _op(
        f"paged_decode_batch{CONTEXT_OP_BATCH}",
        "context",
        [_case(CONTEXT_OP_BATCH, c, c) for c in FULL_CONTEXTS],
        [_case(SMALL_CONTEXT_BATCH, c, c) for c in SMALL_CONTEXTS],
    )
)
FP8_OP = register(_op(f"paged_decode_fp8_ctx{BATCH_OP_CONTEXT}", "batch", _BATCH_FULL, _BATCH_SMALL, fp8=True))
