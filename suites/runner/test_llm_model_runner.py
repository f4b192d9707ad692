"""The model runner's step inputs on a tiny dummy Llama on the CPU (no tokenizer, token-id prompts): every step
hands the model a block table of one fixed width (the engine's max blocks per sequence), so the attention
kernels see one table stride for the whole run (a new stride recompiled them inside timed runs)."""

from __future__ import annotations

import pytest
import torch

from runner import LLM, SamplingParams
from runner.model.llama import LlamaForCausalLM
from suites.runner import tiny_llama
from suites.runner.tiny_llama import TINY_TIED as TINY

BLOCK = 4
MAX_MODEL_LEN = 64  # 16 blocks a sequence


class Recording(torch.nn.Module):
    """The tiny model, noting each step's block-table shape and row stride."""

    def __init__(self, inner: LlamaForCausalLM):
        super().__init__()
        self.inner, self.tables = inner, []

    def forward(self, input_ids, positions, batch, kv_caches):
        self.tables.append((tuple(batch.block_table.shape), batch.block_table.stride(0)))
        return self.inner(input_ids, positions, batch, kv_caches)

    def compute_logits(self, hidden):
        return self.inner.compute_logits(hidden)


@pytest.fixture(scope="module")
def tiny():
    return tiny_llama.model(TINY)


def _llm(model, **kwargs) -> LLM:
    return LLM(
        device="cpu",
        loaded=(model, None, TINY),
        block_size=BLOCK,
        max_model_len=MAX_MODEL_LEN,
        max_num_batched_tokens=64,
        max_num_seqs=8,
        **kwargs,
    )


def test_every_step_has_the_fixed_table_width(tiny):
    recording = Recording(tiny)
    llm = _llm(recording)
    prompts = [[1, 2, 3], list(range(5, 30)), list(range(40, 50))]  # 1, 7 and 3 blocks, growing while decoding
    llm.generate(
        prompts, [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in (9, 3, 6)], use_tqdm=False
    )
    widths = {(shape[1], stride) for shape, stride in recording.tables}
    assert widths == {(MAX_MODEL_LEN // BLOCK, MAX_MODEL_LEN // BLOCK)}
    assert len({shape[0] for shape, _ in recording.tables}) > 1  # the batch shrank as requests finished


def _events(monkeypatch, recording: Recording) -> list[str]:
    """'model' per forward and 'sampling' per SamplingBatch built, in call order."""
    from runner.engine.sampler import SamplingBatch

    events, build, forward = [], SamplingBatch.from_sequences.__func__, recording.forward

    def counted_build(cls, *args, **kwargs):
        events.append("sampling")
        return build(cls, *args, **kwargs)

    def counted_forward(*args, **kwargs):
        events.append("model")
        return forward(*args, **kwargs)

    monkeypatch.setattr(SamplingBatch, "from_sequences", classmethod(counted_build))
    monkeypatch.setattr(recording, "forward", counted_forward)
    return events


def test_all_greedy_steps_build_no_sampling_tensors(tiny, monkeypatch):
    recording = Recording(tiny)
    events = _events(monkeypatch, recording)
    _llm(recording).generate(
        [[1, 2, 3], [4, 5]], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True), use_tqdm=False
    )
    assert events == ["model"] * 4


def test_sampling_tensors_are_built_before_the_model_runs(tiny, monkeypatch):
    recording = Recording(tiny)
    events = _events(monkeypatch, recording)
    params = [
        SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True),
        SamplingParams(temperature=0.8, top_k=5, seed=3, max_tokens=4, ignore_eos=True),
    ]
    outs = _llm(recording).generate([[1, 2, 3], [4, 5]], params, use_tqdm=False)
    assert events == ["sampling", "model"] * 4
    assert all(len(o.token_ids) == 4 for o in outs)


def test_sample_without_a_batch_is_greedy():
    from runner.engine.sampler import SamplingBatch, sample

    logits = torch.randn((5, 11), generator=torch.Generator().manual_seed(1))
    logits[2, 3] = logits[2, 7] = 1e3  # a tie: the lowest id wins
    want = sample(logits, SamplingBatch.build([SamplingParams(temperature=0.0)] * 5, 11))
    assert sample(logits, None).tolist() == want.tolist() and want[2] == 3


def test_kv_sizing_warm_up_samples_max_seqs_rows_without_drawing_from_the_rng(tiny, monkeypatch):
    """The CUDA KV sizing's warm-up (its memory counters stubbed on the CPU) runs the sampler's heaviest path
    (temperature, top-k, top-p) on max_num_seqs rows of logits, and leaves torch's default generator as it was."""
    from runner.engine import sampler

    for name in ("reset_peak_memory_stats", "synchronize", "empty_cache"):
        monkeypatch.setattr(torch.cuda, name, lambda *args, **kwargs: None)
    seen, real = [], sampler.sample
    monkeypatch.setattr(
        sampler, "sample", lambda logits, batch: seen.append((logits.shape, batch)) or real(logits, batch)
    )
    from runner.engine.core_build import warm_up

    llm = _llm(tiny)
    state = torch.get_rng_state()
    warm_up(llm.model, llm.config, llm.dtype, "cpu", BLOCK, max_tokens=24, max_seqs=6, max_model_len=MAX_MODEL_LEN)
    assert torch.equal(torch.get_rng_state(), state)
    [(shape, batch)] = seen
    assert shape == (6, TINY.vocab_size) and batch.any_top_k and batch.any_top_p and not batch.all_greedy
