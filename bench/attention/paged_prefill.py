"""Paged prefill benchmark: causal attention of every new token of a batch over its paged cache.

32 query heads, 8 KV heads, head 128, bf16, block size 16 (bench/attention/paged_decode_inputs.py builds the
problems: random-permutation block tables, the new tokens' K/V already in the cache, no cached prefix). One op,
`paged_prefill_causal`: x = new tokens per sequence 512 .. 4096 at batch 8 (the bar: 8 x 2048 >= 0.9x SDPA flash
TFLOP/s). FLOPs, the causal work only: query i sees keys 0..i, so S(S+1)/2 (query, key) pairs a head and
sequence, each 2 D for q k^T and 2 D for p v: 2 * 2 * B * Hq * S(S+1)/2 * D. Bytes (compulsory): q, K, V and
out once (bf16). Roof: the same-run bf16 GEMM. Implementations:
- reference-mirror: reference.attention.paged.paged_prefill_mirror at the kernel's KV tile (the baseline; a
  Python loop over sequences and tiles that syncs with the host, so it is timed without a CUDA graph);
- triton: kernels.paged_prefill (launch shape: kernels/paged_prefill.py `_GPU`, swept on the H200);
- sdpa-flash (ungated peer): torch SDPA, is_causal=True, enable_gqa=True, on q [B, 32, S, 128] and K/V
  [B, 8, S, 128] gathered once (untimed) into contiguous tensors: the no-paging ceiling. On CUDA the flash
  backend is forced (sdpa_kernel(SDPBackend.FLASH_ATTENTION)): it takes GQA natively (K/V heads unexpanded),
  as in torch >= 2.5; were it to refuse, the factory falls back to SDPA's default choice and warns. The
  output is returned as [T, 32, 128] through transpose + reshape, a view of flash's [B, S, H, D] result (no
  copy timed). On the CPU SDPA's default backend runs (checks the construction only).
- sdpa-flash-expanded (ungated peer): the same with K/V repeated to the 32 query heads (untimed) and no
  enable_gqa: GQA handled natively costs flash nothing (H200, 680c937: 254 and 255 TFLOP/s at 8 x 2048). The
  launch sweep's SDPA (causal_lower_right bias, no graph) ran the same problem at 294 TFLOP/s while the Triton
  kernel timed the same in both; the bar is quoted against both.
Correctness: lossy against the mirror, kernels.tolerances row "paged_prefill". Timing: CUDA-graph replays
(`cuda_graph=True`, as for decode; at these sizes the host costs little either way).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch

from bench.attention import paged_decode_inputs as pdi
from bench.correctness import lossy_check
from bench.quant.sweeps import kernel, triton_skip
from bench.registry import Case, Impl, OpBench, register
from kernels.tolerances import families
from reference.attention.paged import paged_prefill_mirror

FULL_TOKENS, BATCH = (512, 1024, 2048, 4096), 8
# CPU: the harness only (the eager mirror materialises every score in fp32).
SMALL_TOKENS, SMALL_BATCH = (32, 64), 2
# The mirror holds a sequence's 32 x S x S fp32 scores about three times over (scores, masked copy, tile
# temporaries): ~6 GiB at S = 4096 on the GPU, fine. On the CPU it runs only where a few seconds suffice:
# 8 x 256 x 256 x 32 scores (about 4 GFLOP of fp32 einsum).
MIRROR_CPU_MAX_SCORES = 1 << 24


def _case(batch: int, new: int) -> Case:
    return Case(f"B{batch}_S{new}", float(new), (batch, new))


def problem_flops(case: Case) -> int:
    batch, new = case.shape
    return 2 * 2 * batch * pdi.HQ * (new * (new + 1) // 2) * pdi.HEAD


def problem_bytes(case: Case) -> int:
    batch, new = case.shape
    return pdi.kv_bytes(batch, new) + 2 * batch * new * pdi.HQ * pdi.HEAD * 2  # + q and out, bf16


def inputs(case: Case, torch_device: str) -> pdi.PrefillProblem:
    return pdi.make_prefill_problem(*case.shape, torch_device)


def mirror_skip(case: Case, backend: str) -> str | None:
    batch, new = case.shape
    scores = batch * pdi.HQ * new * new
    if backend == "cpu" and scores > MIRROR_CPU_MAX_SCORES:
        return f"the eager mirror's {scores} fp32 scores take minutes on the CPU (cap {MIRROR_CPU_MAX_SCORES})"
    return None


def _mirror(p: pdi.PrefillProblem) -> Callable[[], torch.Tensor]:
    tile_n = kernel("kernels.paged_prefill", "kv_tile")(p.q.device)  # the kernel's rounding points
    return lambda: paged_prefill_mirror(*p.args, tile_n)


def _triton(p: pdi.PrefillProblem) -> Callable[[], torch.Tensor]:
    fn = kernel("kernels.paged_prefill", "paged_prefill")
    q, k, v, table, lens, cu, scale = p.args
    return lambda: fn(q, k, v, table, lens, cu, scale=scale)


def _sdpa_flash_factory(expand_kv: bool) -> Callable[[pdi.PrefillProblem], Callable[[], torch.Tensor]]:
    """SDPA flash on contiguous K/V: GQA native (`enable_gqa`), or K/V expanded to the 32 query heads (untimed)."""

    def factory(p: pdi.PrefillProblem) -> Callable[[], torch.Tensor]:
        batch = p.block_table.shape[0]
        tokens = p.q.shape[0]
        q4 = p.q.view(batch, tokens // batch, pdi.HQ, pdi.HEAD).transpose(1, 2).contiguous()
        k, v = pdi.contiguous_kv(p)
        if expand_kv:
            k, v = (t.repeat_interleave(pdi.HQ // pdi.HKV, dim=1).contiguous() for t in (k, v))
        sdpa = torch.nn.functional.scaled_dot_product_attention

        def call() -> torch.Tensor:
            out = sdpa(q4, k, v, is_causal=True, scale=p.scale, enable_gqa=not expand_kv)
            return out.transpose(1, 2).reshape(p.q.shape)

        if p.q.device.type != "cuda":
            return call
        from torch.nn.attention import SDPBackend, sdpa_kernel

        def flash() -> torch.Tensor:
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                return call()

        try:
            flash()
        except RuntimeError as err:
            warnings.warn(
                f"sdpa-flash: the flash backend refused ({str(err).splitlines()[0][:120]}); "
                "timing SDPA's default backend",
                stacklevel=1,
            )
            return call
        return flash

    return factory


IMPLS = (
    Impl("reference-mirror", _mirror, mirror_skip),
    Impl("triton", _triton, triton_skip),
    Impl("sdpa-flash", _sdpa_flash_factory(expand_kv=False), gated=False),
    Impl("sdpa-flash-expanded", _sdpa_flash_factory(expand_kv=True), gated=False),
)

CAUSAL_OP = register(
    OpBench(
        name="paged_prefill_causal",
        area="attention",
        dtype="bfloat16",
        x_name="tokens",
        sweeps={"small": [_case(SMALL_BATCH, s) for s in SMALL_TOKENS], "full": [_case(BATCH, s) for s in FULL_TOKENS]},
        make_inputs=inputs,
        impls=IMPLS,
        bytes_model=problem_bytes,
        flops_model=problem_flops,
        roof="gemm",
        baselines=("reference-mirror",),
        compare_to="sdpa-flash",
        headline=(("triton", "sdpa-flash"), ("triton", "sdpa-flash-expanded"), ("triton", "gemm")),
        check=lossy_check(families.PAGED_PREFILL),
        cuda_graph=True,
    )
)
