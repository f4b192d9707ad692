"""The model's paged attention path: the fp32 ideal, and a dummy Llama run three ways (one-shot batched
prefill; chunked prefill whose later chunks attend to a cached prefix, several sequences per step; decode
token by token) giving the same logits. The kernel path (store_kv, paged_prefill, paged_decode) runs on the
device tier (Triton interpreter on cpu) against the reference path."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kernels.tolerances import assert_agree, assert_exact, families
from reference.attention.paged import paged_attention_ideal
from runner.model import attention as model_attention
from runner.model.llama import LlamaForCausalLM
from runner.model.weights import dummy_weights
from suites.runner.conftest import one_thread
from suites.runner.model_driver import allocate, step
from suites.runner.tiny_llama import TINY_TIED

TINY = TINY_TIED


def _sdpa_fp64(q, k, v, scale):
    """Plain causal attention of one sequence whose queries are its last q.shape[0] tokens, fp64."""
    group = q.shape[1] // k.shape[1]
    k, v = k.double().repeat_interleave(group, 1), v.double().repeat_interleave(group, 1)
    s = torch.einsum("ihd,jhd->hij", q.double(), k) * scale
    n, length = q.shape[0], k.shape[0]
    s = s.masked_fill(torch.arange(length)[None, :] > torch.arange(length - n, length)[:, None], -math.inf)
    return torch.einsum("hij,jhd->ihd", s.softmax(-1), v)


@given(seed=st.integers(0, 2**16), length=st.integers(1, 40), new=st.integers(1, 40), group=st.sampled_from([1, 3]))
def test_ideal_takes_fp32(seed, length, new, group):
    """fp32 operands are read exactly: the ideal equals plain fp64 attention on them, and on bf16-valued fp32
    operands it gives the bf16 call's bits."""
    new = min(new, length)
    gen = torch.Generator().manual_seed(seed)
    block, hkv = 8, 2
    blocks = -(-length // block)
    k_cache = torch.randn((blocks + 1, block, hkv, 16), generator=gen)
    v_cache = torch.randn((blocks + 1, block, hkv, 16), generator=gen)
    q = torch.randn((new, hkv * group, 16), generator=gen)
    table = torch.randperm(blocks + 1, generator=gen)[:blocks].to(torch.int32)[None]
    lens, cu = torch.tensor([length], dtype=torch.int32), torch.tensor([0, new], dtype=torch.int32)
    got = paged_attention_ideal(q, k_cache, v_cache, table, lens, 0.25, cu)
    pos = torch.arange(length)
    k = k_cache[table[0].long()[pos // block], pos % block]
    v = v_cache[table[0].long()[pos // block], pos % block]
    torch.testing.assert_close(got, _sdpa_fp64(q, k, v, 0.25), rtol=1e-12, atol=1e-12)
    args = [t.bfloat16() for t in (q, k_cache, v_cache)]
    want = paged_attention_ideal(*args, table, lens, 0.25, cu)
    assert_exact(paged_attention_ideal(*(t.float() for t in args), table, lens, 0.25, cu), want)


def test_kernels_refuse_fp32():
    """The fp32 widening is the ideal's alone: the kernels' shared check still refuses fp32 q."""
    from reference.attention.paged import check_paged_args

    q = torch.zeros((1, 2, 16))
    cache = torch.zeros((2, 8, 2, 16))
    with pytest.raises(TypeError, match="q: dtype"):
        check_paged_args(
            q, cache, cache, torch.zeros((1, 1), dtype=torch.int32), torch.ones(1, dtype=torch.int32), None, 0.25
        )


def _tiny_model(dtype=torch.float32, device="cpu", seed=0) -> LlamaForCausalLM:
    model = LlamaForCausalLM(TINY, dtype, device)
    model.load_weights(dummy_weights(TINY, seed=seed, device=device, dtype=dtype))
    return model


def _run(model, prompts, chunk, block_size, device="cpu"):
    """Logits [sum(len), vocab] of every prompt position, prefilling `chunk` tokens per sequence per step
    (chunk 1 = decode steps), all sequences batched in each step."""
    per = -(-max(len(p) for p in prompts) // block_size)
    caches = allocate(model.config, 1 + per * len(prompts), block_size, model.dtype, device)
    tables = [list(range(1 + b * per, 1 + (b + 1) * per))[::-1] for b in range(len(prompts))]  # blocks any order
    rows = [[] for _ in prompts]
    for start in range(0, max(len(p) for p in prompts), chunk):
        todo = [b for b, p in enumerate(prompts) if start < len(p)]
        chunks = [prompts[b][start : start + chunk] for b in todo]
        lens = [start + len(c) for c in chunks]
        batch = model_attention.make_batch(
            [tables[b] for b in todo], lens, [len(c) for c in chunks], block_size, device
        )
        ids = torch.tensor([t for c in chunks for t in c], device=device)
        positions = torch.cat([torch.arange(start, n) for n in lens]).to(device)
        logits = model.compute_logits(model(ids, positions, batch, caches))
        for i, b in enumerate(todo):
            rows[b].append(logits[int(batch.cu_seqlens_q[i]) : int(batch.cu_seqlens_q[i + 1])].cpu())
    return torch.cat([torch.cat(r) for r in rows])


@given(
    seed=st.integers(0, 2**16),
    lens=st.lists(st.integers(1, 24), min_size=1, max_size=3),
    chunk=st.integers(2, 9),
    block_size=st.sampled_from([4, 16]),
)
def test_chunked_prefill_and_decode_match_one_shot(seed, lens, chunk, block_size):
    gen = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, TINY.vocab_size, (n,), generator=gen).tolist() for n in lens]
    model = _tiny_model(seed=seed)
    with one_thread():
        one_shot = _run(model, prompts, max(lens), block_size)
        assert_agree(families.LLAMA_ORDERS, _run(model, prompts, chunk, block_size), one_shot, "chunked prefill logits")
        assert_agree(families.LLAMA_ORDERS, _run(model, prompts, 1, block_size), one_shot, "decode logits")


def test_prefix_cached_step_reads_the_cache():
    """A chunk prefilled after a cached prefix gives the one-shot logits of the whole sequence, and differs
    when the prefix differs (the step really reads the cached K/V)."""
    model = _tiny_model()
    caches = allocate(TINY, 5, 4, torch.float32, "cpu")
    step(model, caches, [[1, 2]], [[5, 6, 7, 8]], [0], 4, "cpu")
    after_prefix = step(model, caches, [[1, 2]], [[9, 9]], [4], 4, "cpu")
    one_shot = step(model, caches, [[3, 4]], [[5, 6, 7, 8, 9, 9]], [0], 4, "cpu")
    assert_agree(families.LLAMA_ORDERS, after_prefix, one_shot, "logits after a cached prefix")
    other = step(model, caches, [[3, 4]], [[5, 6, 7, 1, 9, 9]], [0], 4, "cpu")
    assert (other - one_shot).abs().max() > 1e-3


def test_kernel_path_matches_reference_path(device, monkeypatch):
    """bf16 tiny model through kernels.kv_store / paged_prefill / paged_decode (interpreter on cpu) vs the
    reference path (the fp64 ideal rounded to bf16) on the same weights: one batched prefill with a cached
    prefix, then a decode step."""
    model = _tiny_model(torch.bfloat16, device)
    prompts = [[3, 1, 4, 1, 5, 9, 2, 6], [5, 3, 5], [8, 9, 7, 9, 3, 2, 3, 8, 4, 6, 2]]

    def run(kernels: bool):
        monkeypatch.setattr(model_attention, "uses_kernels", lambda q: kernels)
        caches = allocate(TINY, 8, 16, torch.bfloat16, device)
        tables = [[1, 2], [3, 4], [5, 6]]
        out = [step(model, caches, tables, [p[:2] for p in prompts], [0, 0, 0], 16, device)]
        out.append(step(model, caches, tables, [p[2:] for p in prompts], [2, 2, 2], 16, device))
        out.append(step(model, caches, tables, [[1], [2], [3]], [len(p) for p in prompts], 16, device))
        return torch.cat(out)

    assert_agree(families.LLAMA_KERNELS, run(True).cpu(), run(False).cpu(), "logits")
