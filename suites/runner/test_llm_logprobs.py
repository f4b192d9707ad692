"""Logprobs through the engine (SamplingParams.logprobs / prompt_logprobs) against a reference: the same model
run over the whole sequence (prompt + generated tokens) in one forward, log_softmax of its fp32 logits at
every position. Each generated token's logprob, rank and top-k, and each prompt token's (after the first),
must match that reference within the RUNNER_LOGPROBS agreement row, on a tiny dummy Llama and on the real
SmolLM2-135M; chunked prefill (the prompt scored chunk by chunk) must give what one prefill gives; a request
that asks for prompt logprobs takes no prefix-cache hit (a cached position has no logits), which the
negative control shows the check depends on."""

from __future__ import annotations

import msgspec
import pytest
import torch

from kernels.tolerances import assert_agree, families
from kernels.tolerances.table import AGREEMENT
from runner import LLM, SamplingParams
from runner.engine import kv_cache_manager, messages
from runner.engine import model_runner as model_runner_mod
from runner.engine.core_build import EngineConfig, build_core
from runner.model.attention import make_batch
from suites.runner import tiny_llama
from suites.runner.model_driver import allocate
from suites.runner.tiny_llama import TINY

pytestmark = pytest.mark.usefixtures("single_thread")

BLOCK = 4
TOL = AGREEMENT[(families.RUNNER_LOGPROBS, torch.float32)].max_rel


@pytest.fixture(scope="module")
def tiny():
    return tiny_llama.model(TINY)


def _tiny_llm(model, **kwargs) -> LLM:
    base = dict(block_size=BLOCK, max_model_len=64, max_num_batched_tokens=64, max_num_seqs=8)
    return LLM(device="cpu", loaded=(model, None, TINY), **{**base, **kwargs})


@torch.inference_mode()
def reference(model, tokens: list[int], block_size: int = 16) -> torch.Tensor:
    """log_softmax of the logits at every position of `tokens` [L, vocab], from one forward over all of them."""
    blocks = -(-len(tokens) // block_size)
    caches = allocate(model.config, 1 + blocks, block_size, torch.float32, "cpu")
    batch = make_batch([list(range(1, 1 + blocks))], [len(tokens)], [len(tokens)], block_size)
    hidden = model(torch.tensor(tokens), torch.arange(len(tokens)), batch, caches)
    return torch.log_softmax(model.compute_logits(hidden), dim=-1)


def _check_entry(entry, token: int, row: torch.Tensor, k: int, got: list, want: list) -> None:
    """One position: the chosen token, its logprob, its rank (up to ties within the tolerance) and the top k."""
    tol = TOL * max(float(row.abs().max()), 1.0)
    assert entry.token_id == token
    got.append(entry.logprob)
    want.append(float(row[token]))
    surely, maybe = int((row > row[token] + tol).sum()), int((row > row[token] - tol).sum())
    assert surely + 1 <= entry.rank <= maybe + 1, (entry.rank, surely, maybe)
    assert len(entry.top_ids) == len(entry.top_logprobs) == k and len(set(entry.top_ids)) == k
    assert entry.top_logprobs == sorted(entry.top_logprobs, reverse=True)
    got.extend(entry.top_logprobs)
    want.extend(row[entry.top_ids].tolist())
    if k:  # the k most likely: none of them below the reference's k-th value
        kth = float(row.topk(k).values[-1])
        assert all(float(row[i]) >= kth - tol for i in entry.top_ids)


def check(model, prompt: list[int], out, k: int | None, prompt_k: int | None, block_size: int = 16) -> None:
    """`out` (a RequestOutput) against the one-shot reference of prompt + its tokens."""
    ref = reference(model, prompt + out.token_ids, block_size)
    got, want = [], []
    if prompt_k is None:
        assert out.prompt_logprobs is None
    else:
        assert len(out.prompt_logprobs) == len(prompt) and out.prompt_logprobs[0] is None
        for p in range(1, len(prompt)):
            _check_entry(out.prompt_logprobs[p], prompt[p], ref[p - 1], prompt_k, got, want)
    if k is None:
        assert out.logprobs is None
    else:
        assert len(out.logprobs) == len(out.token_ids)
        for j, token in enumerate(out.token_ids):
            _check_entry(out.logprobs[j], token, ref[len(prompt) - 1 + j], k, got, want)
    assert_agree(families.RUNNER_LOGPROBS, torch.tensor(got), torch.tensor(want), "engine logprobs")


PROMPTS = [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11], [7, 8, 9], list(range(20, 45)), [50]]
PARAMS = [
    SamplingParams(temperature=0.0, max_tokens=6, logprobs=5, prompt_logprobs=3, ignore_eos=True),
    SamplingParams(temperature=0.9, top_k=7, seed=3, max_tokens=5, logprobs=0, prompt_logprobs=0, ignore_eos=True),
    SamplingParams(temperature=0.7, top_p=0.8, seed=4, max_tokens=4, logprobs=20, prompt_logprobs=20, ignore_eos=True),
    SamplingParams(temperature=0.0, max_tokens=3, logprobs=2, prompt_logprobs=1, ignore_eos=True),
]


@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("budget", [64, 5], ids=["whole-prompts", "chunked"])
def test_logprobs_match_a_one_shot_forward(tiny, budget, overlap):
    llm = _tiny_llm(tiny, max_num_batched_tokens=budget, max_num_seqs=4, async_scheduling=overlap)
    outs = llm.generate(PROMPTS, PARAMS, use_tqdm=False)
    if budget == 5:
        assert llm.engine.stats.prompt_chunks >= 5  # the long prompts were scored chunk by chunk
    for prompt, params, out in zip(PROMPTS, PARAMS, outs, strict=True):
        check(tiny, prompt, out, params.logprobs, params.prompt_logprobs)
        if params.temperature == 0:  # greedy: every token is the most likely one
            assert all(e.rank == 1 and e.top_ids[0] == e.token_id for e in out.logprobs)
    assert [e.rank for e in outs[1].logprobs] != [1] * 5  # sampled tokens: not always the argmax


def test_chunked_prompt_logprobs_equal_unchunked(tiny):
    params = SamplingParams(temperature=0.0, max_tokens=2, prompt_logprobs=4)
    whole = _tiny_llm(tiny).generate(PROMPTS[2:3], params, use_tqdm=False)[0].prompt_logprobs
    chunked = _tiny_llm(tiny, max_num_batched_tokens=8, max_num_seqs=2).generate(PROMPTS[2:3], params, use_tqdm=False)
    chunked = chunked[0].prompt_logprobs
    assert [e.token_id for e in chunked[1:]] == [e.token_id for e in whole[1:]] == PROMPTS[2][1:]
    assert [e.top_ids for e in chunked[1:]] == [e.top_ids for e in whole[1:]]
    assert [e.rank for e in chunked[1:]] == [e.rank for e in whole[1:]]
    assert_agree(families.RUNNER_LOGPROBS, _values(chunked), _values(whole), "chunked vs whole prompt logprobs")


def _values(entries) -> torch.Tensor:
    return torch.tensor([[e.logprob, *e.top_logprobs] for e in entries[1:]])


def test_only_rows_that_ask_compute_logprobs(tiny, monkeypatch):
    """The logprob pass runs on the rows that asked, and not at all in a batch where none did."""
    seen, real = [], model_runner_mod.token_logprobs
    monkeypatch.setattr(
        model_runner_mod,
        "token_logprobs",
        lambda logits, ids, k: seen.append((logits.shape[0], k)) or real(logits, ids, k),
    )
    plain = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    asks = SamplingParams(temperature=0.0, max_tokens=3, logprobs=2, ignore_eos=True)
    llm = _tiny_llm(tiny)
    outs = llm.generate(PROMPTS[:3], plain, use_tqdm=False)
    assert seen == [] and all(o.logprobs is None and o.prompt_logprobs is None for o in outs)
    outs = llm.generate(PROMPTS[:3], [plain, asks, plain], use_tqdm=False)
    assert seen == [(1, 2)] * 3  # one row a step, three steps
    assert outs[0].logprobs is None and outs[2].logprobs is None and len(outs[1].logprobs) == 3


def test_loglikelihood_request_with_max_tokens_one(tiny):
    """lm-evaluation-harness's log-likelihood: echo the prompt's logprobs and generate one token. The sum over
    a continuation's tokens is what it scores."""
    context, continuation = [3, 1, 4, 1, 5, 9, 2, 6], [5, 3, 5]
    params = SamplingParams(temperature=0.0, max_tokens=1, logprobs=1, prompt_logprobs=1)
    for budget in (64, 3):
        (out,) = _tiny_llm(tiny, max_num_batched_tokens=budget, max_num_seqs=2).generate(
            [context + continuation], params, use_tqdm=False
        )
        assert len(out.token_ids) == 1 and out.finish_reason == "length"
        check(tiny, context + continuation, out, 1, 1)
        ref = reference(tiny, context + continuation)
        score = sum(e.logprob for e in out.prompt_logprobs[len(context) :])
        want = sum(float(ref[p - 1, t]) for p, t in enumerate(continuation, start=len(context)))
        assert abs(score - want) <= TOL * 3 * max(float(ref.abs().max()), 1.0)


PREFIX = list(range(30, 43))  # 3 full blocks and one token
SCORED = [*PREFIX, 70, 71]


def _shared_prefix_run(tiny) -> tuple[LLM, object]:
    """A plain request fills the prefix cache; then one that shares its first 3 blocks asks for prompt
    logprobs. Returns the engine and the second request's output."""
    llm = _tiny_llm(tiny, enable_prefix_caching=True)
    llm.generate([[*PREFIX, 60]], SamplingParams(temperature=0.0, max_tokens=2), use_tqdm=False)
    (out,) = llm.generate([SCORED], SamplingParams(temperature=0.0, max_tokens=2, prompt_logprobs=2), use_tqdm=False)
    return llm, out


def test_prompt_logprobs_skip_the_prefix_cache(tiny):
    llm, out = _shared_prefix_run(tiny)
    assert llm.engine.scheduler.num_prompt_tokens_hit == 0
    check(tiny, SCORED, out, None, 2)
    # The cache was there: the same prompt without prompt logprobs hits the 3 shared blocks.
    llm.generate([[*PREFIX, 70, 72]], SamplingParams(max_tokens=1), use_tqdm=False)
    assert llm.engine.scheduler.num_prompt_tokens_hit == 3 * BLOCK


def test_negative_control_prompt_logprobs_through_a_cache_hit_miss_positions(tiny, monkeypatch):
    """Planted bug: the cache skip removed. The request hits the cached prefix and never runs those positions,
    so the full-prompt check above would fail: their entries stay empty."""
    monkeypatch.setattr(kv_cache_manager, "skips_cache", lambda seq: False)
    llm, out = _shared_prefix_run(tiny)
    assert llm.engine.scheduler.num_prompt_tokens_hit == 3 * BLOCK
    assert out.prompt_logprobs[1 : 3 * BLOCK + 1].count(None) == 3 * BLOCK
    with pytest.raises(AttributeError):  # check() reads an entry of every position
        check(tiny, SCORED, out, None, 2)


def test_prompt_logprobs_arrive_once_with_the_first_token(tiny):
    core, _ = build_core(
        EngineConfig(device="cpu", block_size=BLOCK, max_model_len=64, max_num_batched_tokens=4, max_num_seqs=2),
        (tiny, None, TINY),
    )
    params = SamplingParams(temperature=0.0, max_tokens=3, logprobs=1, prompt_logprobs=1, ignore_eos=True)
    core.add_request(messages.AddRequest("a", list(range(10)), params))
    deltas = []
    while core.has_unfinished:
        step = core.step()
        deltas += step.deltas
        # what an engine-core process sends: the logprobs survive MessagePack
        decoded = msgspec.msgpack.decode(msgspec.msgpack.encode(step), type=messages.StepOutputs)
        assert decoded == step
    assert [len(d.new_token_ids) for d in deltas] == [1, 1, 1]
    assert [d.prompt_logprobs is not None for d in deltas] == [True, False, False]
    assert len(deltas[0].prompt_logprobs) == 10 and all(len(d.new_logprobs) == 1 for d in deltas)


def test_real_model_logprobs_match_a_one_shot_forward(smollm2):
    model, tokenizer, _ = smollm2
    prompt = tokenizer.encode("The capital of France is Paris. The capital of Italy is")
    params = SamplingParams(temperature=0.0, max_tokens=4, logprobs=5, prompt_logprobs=5)
    llm = LLM(device="cpu", loaded=smollm2, max_num_batched_tokens=8, max_num_seqs=2)  # chunked: 8 a step
    (out,) = llm.generate([prompt], params, use_tqdm=False)
    assert llm.engine.stats.prompt_chunks >= 1
    check(model, prompt, out, 5, 5)
    assert all(e.rank == 1 for e in out.logprobs)
