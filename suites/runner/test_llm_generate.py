"""End-to-end generation with the real SmolLM2-135M-Instruct on CPU (fp32): engine configurations that must
not change a greedy token (prefix caching on/off, chunked prefill with a tiny token budget, preemption
forced by a tiny KV cache), seeded sampling, stop strings and ignore_eos, each with asynchronous scheduling
on and off.

Each configuration's tokens are compared with a baseline engine with prefix caching off, synchronous
scheduling and a budget that takes every prompt whole (one prefill step, then decodes: no reuse, no
chunking, no preemption); that baseline agrees with a request run alone. HF parity of the model itself is
runner-model's suite (test_model_*). The CPU costs about a model's fp32 weights (0.5 GB) read per step, so
tests count steps."""

from __future__ import annotations

import dataclasses

import pytest

from runner import LLM, SamplingParams
from runner.engine.step_tensors import StepPacker

pytestmark = pytest.mark.usefixtures("single_thread")

SHARED = (
    "You are a careful assistant. Answer in one short sentence, with no preamble, and never repeat the "
    "question back. Question: "
)
QUESTIONS = (
    "What is the capital of France?",
    "Why is the sky blue?",
    "What is 7 times 8?",
    "Name a prime number larger than ten.",
    "What colour is a ripe banana?",
    "Who wrote Hamlet?",
)
# Six prompts sharing a prefix of several full blocks, one prompt repeated (a full hit: capped at n - 1
# tokens), and one unrelated prompt.
PROMPTS = [SHARED + q for q in QUESTIONS] + [SHARED + QUESTIONS[0], "def fibonacci(n):"]
GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


def _llm(smollm2, **kwargs) -> LLM:
    return LLM(device="cpu", loaded=smollm2, **kwargs)


@pytest.fixture(scope="module")
def baseline_outputs(smollm2):
    return _llm(smollm2, enable_prefix_caching=False, async_scheduling=False).generate(PROMPTS, GREEDY, use_tqdm=False)


OVERLAP = pytest.mark.parametrize("overlap", [False, True], ids=["sync", "async"])


@pytest.fixture(scope="module")
def baseline(baseline_outputs) -> list[list[int]]:
    return [o.token_ids for o in baseline_outputs]


@OVERLAP
def test_baseline_batch_agrees_with_a_request_alone(smollm2, baseline, overlap):
    alone = _llm(smollm2, enable_prefix_caching=False, max_num_seqs=1, async_scheduling=overlap)
    assert _tokens(alone, PROMPTS[1:2]) == baseline[1:2]


def _tokens(llm: LLM, prompts=PROMPTS, params=GREEDY) -> list[list[int]]:
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert all(o.finish_reason == "length" and len(o.token_ids) == params.max_tokens for o in outs)
    return [o.token_ids for o in outs]


def _with_prefix_hits(smollm2, overlap: bool = True) -> tuple[list[list[int]], int]:
    """(tokens, prompt tokens served from the prefix cache) of the batch after one prompt filled the cache."""
    llm = _llm(smollm2, enable_prefix_caching=True, async_scheduling=overlap)
    llm.generate(PROMPTS[:1], SamplingParams(max_tokens=1), use_tqdm=False)
    return _tokens(llm), llm.engine.scheduler.num_prompt_tokens_hit


@OVERLAP
def test_prefix_caching_gives_the_same_tokens(smollm2, baseline, overlap):
    tokens, hit = _with_prefix_hits(smollm2, overlap)
    assert tokens == baseline
    assert hit >= 16 * (len(PROMPTS) - 1)  # every related prompt reused at least a block


def test_negative_control_a_runner_that_forgets_the_cached_prefix_is_caught(smollm2, baseline, monkeypatch):
    """Planted bug: prompt rows that start after a cached prefix attend to their new tokens only (seq_lens
    without the prefix). The prefix-caching comparison must see different tokens."""
    real = StepPacker.pack

    def forgetful(self, output, block_table_width=None):
        inputs = real(self, output, block_table_width)
        lens = inputs.seq_lens.clone()
        for row, entry in enumerate(output.scheduled):
            if entry.start > 0 and entry.num_new_tokens > 1:
                lens[row] = entry.num_new_tokens
        return dataclasses.replace(inputs, seq_lens=lens)

    monkeypatch.setattr(StepPacker, "pack", forgetful)
    tokens, hit = _with_prefix_hits(smollm2)
    assert hit > 0 and tokens != baseline


@OVERLAP
def test_chunked_prefill_gives_the_same_tokens(smollm2, baseline, overlap):
    llm = _llm(smollm2, max_num_batched_tokens=24, max_num_seqs=8, async_scheduling=overlap)  # prompts in chunks
    assert _tokens(llm) == baseline
    assert llm.engine.stats.prompt_chunks >= 4  # rows that computed part of a prompt and sampled nothing


@OVERLAP
def test_forced_preemption_gives_the_same_tokens(smollm2, baseline, overlap):
    # 13 usable blocks of 16 tokens for 8 requests of ~40-70 tokens
    llm = _llm(smollm2, num_kv_blocks=14, async_scheduling=overlap)
    assert _tokens(llm) == baseline
    assert llm.engine.scheduler.num_preemptions > 0


@OVERLAP
def test_seeded_sampling_is_reproducible_and_batch_independent(smollm2, overlap):
    params = SamplingParams(temperature=0.9, top_p=0.95, top_k=50, seed=1234, max_tokens=12, ignore_eos=True)
    alone = _tokens(_llm(smollm2, async_scheduling=False), PROMPTS[1:2], params)[0]
    # chunks sample nothing: the same stream
    chunked = _llm(smollm2, max_num_batched_tokens=16, max_num_seqs=4, async_scheduling=overlap)
    others = SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True)
    mixed = chunked.generate([PROMPTS[0], PROMPTS[1], PROMPTS[2]], [others, params, others], use_tqdm=False)
    assert mixed[1].token_ids == alone
    reseeded = _tokens(_llm(smollm2), PROMPTS[1:2], SamplingParams(**{**vars(params), "seed": 4321}))[0]
    assert reseeded != alone


@OVERLAP
def test_stop_string_cuts_the_text_and_finishes(smollm2, baseline_outputs, overlap):
    llm = _llm(smollm2, async_scheduling=overlap)
    prompt, free = PROMPTS[-1], baseline_outputs[-1]
    text = free.text
    stop = text.strip()[4:7]  # three characters inside the completion, likely spanning a token boundary
    at = text.find(stop)
    out = llm.generate(
        [prompt], SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, stop=[stop]), use_tqdm=False
    )[0]
    assert (out.finish_reason, out.stop_reason, out.text) == ("stop", stop, text[:at])
    assert out.token_ids == free.token_ids[: len(out.token_ids)] and len(out.token_ids) < len(free.token_ids)


@OVERLAP
def test_ignore_eos_runs_past_the_end_of_turn(smollm2, overlap):
    llm = _llm(smollm2, async_scheduling=overlap)
    chat = [{"role": "user", "content": "What is 2+2? Reply with the number only."}]
    ended = llm.chat(chat, SamplingParams(temperature=0.0, max_tokens=24), use_tqdm=False)[0]
    eos = llm.tokenizer.eos_token_id
    assert (ended.finish_reason, ended.stop_reason, ended.token_ids[-1]) == ("stop", eos, eos)
    assert "4" in ended.text and len(ended.token_ids) < 24
    forced = llm.chat(chat, SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True), use_tqdm=False)[0]
    assert forced.finish_reason == "length" and len(forced.token_ids) == 24
    assert forced.token_ids[: len(ended.token_ids)] == ended.token_ids
