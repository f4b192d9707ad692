"""RoPE benchmarks (the runner's decode step rotates q and k once per layer, 30 layers of SmolLM2-135M):
tokens 1..4096 (decode batch to prefill) for SmolLM2-135M heads (q 9, kv 3, head_dim 64) and Llama-8B heads
(q 32, kv 8, head_dim 128), bf16, q and k as views into a fused qkv buffer (the runner's layout).

Bandwidth-bound, measured against the same-run memcpy roof. Bytes per call (compulsory): q and k read and
written (4 * T * (Hq + Hkv) * D bytes), the positions (8 T) and the tokens' fp32 table rows (4 T D).
Implementations:
- reference-eager: reference.rotary.rope.apply_rope (the mirror every row is checked against, bit-exact; it
  checks the positions' range on the host, so it is timed without a CUDA graph);
- hf-eager (ungated peer): transformers' Llama `apply_rotary_pos_emb` (the eager sequence the runner ran before
  this kernel) with the step's cos/sin [1, T, D] in q's dtype computed once outside the timed call,
  i.e. the ~10 kernels a layer the op replaces. It rounds cos/sin and every intermediate to bf16, so its
  outputs differ from the fp32 mirror by an ulp in places: not expected to be bit-equal, its verdict records
  the measured difference ("differs as expected"), and it is not gated;
- hf-compiled (ungated peer): torch.compile of that same apply_rotary_pos_emb;
- triton: kernels.rope.rope_, in place on its own copy of the buffer (copied untimed). The timed calls keep
  rotating the same q and k, so the first (untimed) call returns a snapshot of q and k for the check.
Timing: CUDA-graph replays (`cuda_graph=True`): a decode-sized rotation runs for a few microseconds.
"""

from __future__ import annotations

import torch

from bench.correctness import expected_difference
from bench.quant.sweeps import compiled, kernel, triton_skip
from bench.registry import Case, Impl, OpBench, register
from reference.rotary.rope import apply_rope, rope_cos_sin_cache

BASE = 10000.0
MAX_POSITIONS = 8192  # SmolLM2-135M's context
HEADS = ((9, 3, 64), (32, 8, 128))  # (q heads, kv heads, head_dim): SmolLM2-135M, Llama-3-8B
FULL_TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
SMALL_TOKENS = (1, 4, 32)


def _sweeps(hq: int, hkv: int, d: int) -> dict[str, list[Case]]:
    return {
        sweep: [Case(f"T{t}", float(t), (t, hq, hkv, d)) for t in tokens]
        for sweep, tokens in (("small", SMALL_TOKENS), ("full", FULL_TOKENS))
    }


def _inputs(case: Case, torch_device: str) -> dict:
    t, hq, hkv, d = case.shape
    g = torch.Generator(device=torch_device).manual_seed(0)
    qkv = torch.randn(t, (hq + 2 * hkv) * d, dtype=torch.bfloat16, device=torch_device, generator=g)
    positions = torch.randint(0, MAX_POSITIONS, (t,), device=torch_device, generator=g)
    return dict(
        qkv=qkv,
        heads=(hq, hkv, d),
        positions=positions,
        table=rope_cos_sin_cache(d, BASE, MAX_POSITIONS, device=torch_device),
    )


def views(qkv: torch.Tensor, heads: tuple[int, int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """q [T, Hq, D] and k [T, Hkv, D]: views into the fused qkv buffer, as the runner splits it."""
    hq, hkv, d = heads
    t = qkv.shape[0]
    return qkv[:, : hq * d].view(t, hq, d), qkv[:, hq * d : (hq + hkv) * d].view(t, hkv, d)


def _reference(inputs: dict):
    q, k = views(inputs["qkv"], inputs["heads"])
    return lambda: apply_rope(q, k, inputs["positions"], inputs["table"])


def hf_rotation(compile_it: bool):
    def factory(inputs: dict):
        from transformers import LlamaConfig
        from transformers.models.llama import modeling_llama

        d = inputs["heads"][2]
        q, k = views(inputs["qkv"], inputs["heads"])
        config = LlamaConfig(
            hidden_size=4 * d, num_attention_heads=4, head_dim=d, rope_theta=BASE, max_position_embeddings=MAX_POSITIONS
        )
        with torch.device(q.device):  # the table built on q's device, as HF builds it in a model there
            emb = modeling_llama.LlamaRotaryEmbedding(config)
        # cos/sin once a step in HF (and in the runner before it had this kernel): untimed, in q's dtype
        cos, sin = emb(q[None], inputs["positions"][None])
        q4, k4 = q.transpose(0, 1)[None], k.transpose(0, 1)[None]  # HF's [1, H, T, D] views of the same bytes
        rotate = compiled(modeling_llama.apply_rotary_pos_emb) if compile_it else modeling_llama.apply_rotary_pos_emb
        return lambda: tuple(t[0].transpose(0, 1) for t in rotate(q4, k4, cos, sin))

    return factory


# HF rounds cos/sin, both products and their sum to bf16; the mirror computes in fp32 and rounds once. Measured
# on the CPU (both head shapes, 1-256 tokens, randn q/k, positions < 8192): max_rel <= 7.5e-3 of the peak, about
# one bf16 ulp (2**-7); a bound of two ulps (2**-6) separates that rounding from a wrong rotation (O(1)).
HF_CHECK = expected_difference("HF rounds cos/sin and every intermediate to bf16", 2.0**-6)


def _triton(inputs: dict):
    rope_ = kernel("kernels.rope", "rope_")
    qkv = inputs["qkv"].clone()  # untimed: the in-place op rotates its own copy
    q, k = views(qkv, inputs["heads"])
    positions, table = inputs["positions"], inputs["table"]
    first = [True]

    def call():
        rope_(q, k, positions, table)
        if first[0]:  # the runner's correctness call: a snapshot, before timing rotates q and k again
            first[0] = False
            return q.clone(), k.clone()
        return None

    return call


def moved_bytes(case: Case) -> int:
    t, hq, hkv, d = case.shape
    return 2 * t * (hq + hkv) * d * 2 + 8 * t + 4 * t * d


def _op(hq: int, hkv: int, d: int) -> OpBench:
    return OpBench(
        name=f"rope_q{hq}_kv{hkv}_d{d}",
        area="rotary",
        dtype="bfloat16",
        x_name="tokens",
        sweeps=_sweeps(hq, hkv, d),
        make_inputs=_inputs,
        impls=(
            Impl("reference-eager", _reference),
            Impl("hf-eager", hf_rotation(False), gated=False, check=HF_CHECK),
            Impl("hf-compiled", hf_rotation(True), gated=False, check=HF_CHECK),
            Impl("triton", _triton, triton_skip),
        ),
        bytes_model=moved_bytes,
        flops_model=lambda case: 6 * case.shape[0] * (case.shape[1] + case.shape[2]) * d,
        roof="memcpy",
        baselines=("reference-eager",),
        compare_to="hf-eager",
        headline=(("triton", "hf-eager"), ("triton", "hf-compiled"), ("triton", "memcpy")),
        cuda_graph=True,
    )


OPS = [register(_op(*heads)) for heads in HEADS]
