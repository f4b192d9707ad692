"""The decode fast path through the whole engine (scheduler columns, the model runner's decode packing and
placeholder tokens, the core's deltas, the output processor) on a tiny dummy Llama on the CPU: tokens, finish
reasons and logprobs equal the engine's with the fast path off, synchronous and asynchronous, with greedy and
seeded sampling, logprobs, stop token ids, requests ending at different steps (the rows after them move up:
their placeholders take another row of the step before), waiting requests admitted as others finish, and a
cache small enough to preempt. Negative control: the planted decode_slot fault changes the tokens."""

from __future__ import annotations

import pytest
import torch

from runner import LLM, SamplingParams
from suites.runner import tiny_llama
from suites.runner.tiny_llama import TINY

pytestmark = pytest.mark.usefixtures("single_thread")

PROMPTS = [[1, 2, 3], list(range(10, 30)), [40, 41, 42, 43, 44], [7] * 9, list(range(50, 56))]
PARAMS = [
    SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True),
    SamplingParams(temperature=0.8, top_k=20, seed=5, max_tokens=17, ignore_eos=True),
    SamplingParams(temperature=0.0, max_tokens=20, logprobs=2, ignore_eos=True),
    SamplingParams(temperature=0.0, max_tokens=24, stop_token_ids=[11, 60], ignore_eos=True),
    SamplingParams(temperature=0.9, seed=1, max_tokens=9, logprobs=0, ignore_eos=True),
]


@pytest.fixture(scope="module")
def tiny():
    return tiny_llama.model(TINY)


def _llm(tiny, **kw) -> LLM:
    base = dict(block_size=4, max_model_len=64, max_num_batched_tokens=16, max_num_seqs=4)
    return LLM(device="cpu", loaded=(tiny, None, TINY), **{**base, **kw})


def _outputs(llm: LLM) -> list[tuple]:
    outs = llm.generate(PROMPTS, PARAMS, use_tqdm=False)
    return [
        (o.token_ids, o.finish_reason, o.stop_reason, [(lp.token_id, lp.rank) for lp in o.logprobs or []]) for o in outs
    ]


def _record_fast_steps(llm: LLM) -> list:
    """The fast path's decode columns of every step it took."""
    taken, schedule = [], llm.engine.scheduler.schedule

    def recorded():
        out = schedule()
        if out.decode is not None:
            taken.append(out.decode)
        return out

    llm.engine.scheduler.schedule = recorded
    return taken


@pytest.mark.parametrize("blocks", [None, 12], ids=["roomy", "preempting"])
@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "async"])
def test_the_fast_path_gives_the_general_paths_outputs(tiny, overlap, blocks):
    want = _outputs(_llm(tiny, async_scheduling=overlap, decode_fast_path=False, num_kv_blocks=blocks))
    llm = _llm(tiny, async_scheduling=overlap, num_kv_blocks=blocks)
    taken = _record_fast_steps(llm)
    assert _outputs(llm) == want
    assert len(taken) >= (15 if blocks is None else 5)  # not vacuous (preempted requests wait: fewer)
    if overlap and blocks is None:  # a request ended: the rows after it took tokens of other rows of the step before
        moved = [d.prev_rows for d in taken if min(d.prev_rows) >= 0 and d.prev_rows != list(range(len(d.seqs)))]
        assert moved
    if blocks is not None:
        assert llm.engine.scheduler.num_preemptions > 0


def test_logprobs_are_the_general_paths(tiny):
    """Values, not only ranks: the fast path's rows give the same logits rows."""
    kw = dict(async_scheduling=True, num_kv_blocks=None)
    a = _llm(tiny, **kw).generate(PROMPTS, PARAMS, use_tqdm=False)
    b = _llm(tiny, decode_fast_path=False, **kw).generate(PROMPTS, PARAMS, use_tqdm=False)
    for x, y in zip(a, b, strict=True):
        assert x.logprobs == y.logprobs


@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "async"])
def test_negative_control_a_slot_one_block_off_changes_the_tokens(tiny, overlap):
    want = _outputs(_llm(tiny, async_scheduling=overlap, decode_fast_path=False))
    llm = _llm(tiny, async_scheduling=overlap)
    llm.engine.scheduler.fault = "decode_slot"
    assert [o[0] for o in _outputs(llm)] != [o[0] for o in want]


@pytest.mark.gpu_only(reason="captures and replays CUDA graphs")
@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "async"])
def test_the_fast_path_gives_the_general_paths_outputs_with_graphs(device, overlap):
    """bf16 on CUDA, decode through CUDA graphs (the fast path's packed inputs copied into the graphs' static
    buffers, the placeholder tokens gathered into them before the replay): the same batches as the general
    path, so the same kernels on the same inputs: tokens and logprobs equal exactly."""
    config = tiny_llama.SMALL_GPU
    model = tiny_llama.model(config, device, torch.bfloat16)
    got = {}
    for fast in (False, True):
        llm = LLM(
            device=device,
            loaded=(model, None, config),
            dtype=torch.bfloat16,
            max_num_seqs=8,
            max_num_batched_tokens=16,
            max_model_len=128,
            num_kv_blocks=64,
            async_scheduling=overlap,
            decode_fast_path=fast,
        )
        assert llm.engine.runner.graphs.graphs
        taken = _record_fast_steps(llm)
        outs = llm.generate(PROMPTS, PARAMS, use_tqdm=False)
        got[fast] = [(o.token_ids, o.finish_reason, o.logprobs) for o in outs]
        assert len(taken) >= 10 if fast else not taken
    assert got[True] == got[False]
