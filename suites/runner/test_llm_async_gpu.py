"""Asynchronous scheduling on a real GPU (`--device cuda`; skipped on the interpreter tier): the host
schedules step N+1 while the GPU still runs step N (CUDA events recorded on the stream around each step's
forward, against host timestamps of the next step's schedule; one step at a time is the negative control),
launching a step never synchronizes with the device (torch's sync debug mode set to raise), the sampled
tokens come back through pinned memory, and tokens and logprobs equal the synchronous engine's with decode
CUDA graphs, chunked prefill, seeded sampling and stop token ids."""

from __future__ import annotations

import time

import pytest
import torch

from kernels.tolerances import assert_agree, families
from runner import LLM, SamplingParams
from suites.runner import tiny_llama
from suites.runner.tiny_llama import SMALL_GPU as CONFIG

# GPU time queued ahead of each forward (torch.cuda._sleep cycles; ~50 ms at the H200's 1.98 GHz clock): the
# host's work between two steps is ~1-5 ms of Python, so a step still runs when the next one is scheduled.
SLEEP_CYCLES = 100_000_000
PROMPTS = [[(11 * i + 3 * j) % 500 + 1 for j in range(5 + 3 * i)] for i in range(5)]


def _model(device):
    return tiny_llama.model(CONFIG, device, torch.bfloat16)


class Timed(torch.nn.Module):
    """The model with a sleep queued before each forward and a timing event recorded after it."""

    def __init__(self, inner):
        super().__init__()
        self.inner, self.ends = inner, []

    def forward(self, input_ids, positions, batch, kv_caches):
        torch.cuda._sleep(SLEEP_CYCLES)
        hidden = self.inner(input_ids, positions, batch, kv_caches)
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        self.ends.append(end)
        return hidden

    def compute_logits(self, hidden):
        return self.inner.compute_logits(hidden)


@pytest.mark.gpu_only(reason="CUDA events on the stream against host timestamps; torch's CUDA sync debug mode")
@pytest.mark.parametrize("overlap", [True, False], ids=["async", "sync-negative-control"])
def test_host_schedules_step_n_plus_one_while_the_gpu_runs_step_n(device, overlap):
    timed = Timed(_model(device))
    llm = LLM(
        device=device,
        loaded=(timed, None, CONFIG),
        dtype=torch.bfloat16,
        max_num_seqs=8,
        max_num_batched_tokens=64,
        max_model_len=128,
        num_kv_blocks=64,
        enforce_eager=True,  # one forward a step, outside any graph: one event a step
        enable_prefix_caching=False,  # the timed run repeats the warm-up's shapes exactly: nothing compiles
        async_scheduling=overlap,
    )
    core = llm.engine
    # Warm up first: the first run of each shape compiles Triton kernels on the host (hundreds of ms, inside a
    # step's launch), long enough for the GPU to finish the step before that one.
    llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True), use_tqdm=False)
    torch.cuda.synchronize()
    timed.ends.clear()
    first_step = core.scheduler._next_step
    sched, runner = core.scheduler, core.runner
    schedule, launch = sched.schedule, runner.launch
    seen = {}  # step id -> (host seconds since the base event, did the GPU finish the step before?)
    launched = []

    def on_schedule():
        out = schedule()
        if out.scheduled and out.step_id > first_step:
            seen[out.step_id] = (time.perf_counter() - t0, timed.ends[out.step_id - 1 - first_step].query())
        return out

    def on_launch(out, times=None):
        torch.cuda.set_sync_debug_mode("error")  # a synchronizing call in here raises
        try:
            step = launch(out, times)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        launched.append(step)
        return step

    sched.schedule, runner.launch = on_schedule, on_launch
    torch.cuda.synchronize()
    base = torch.cuda.Event(enable_timing=True)
    base.record()  # the stream is idle: it runs at ~t0
    t0 = time.perf_counter()
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    torch.cuda.synchronize()
    assert all(len(o.token_ids) == 8 for o in outs) and len(seen) >= 7
    assert all(step.host_tokens.is_pinned() for step in launched if step.host_tokens is not None)
    # The base event ran no earlier than ~t0 on the host's clock, so t0 + elapsed is no later than the GPU's end.
    gpu_end = {n: base.elapsed_time(timed.ends[n - 1 - first_step]) / 1e3 for n in seen}
    if overlap:
        assert all(not finished for _, finished in seen.values())
        assert all(host < gpu_end[n] for n, (host, _) in seen.items())
    else:
        assert all(finished for _, finished in seen.values())


@pytest.mark.gpu_only(reason="captures and replays CUDA graphs")
def test_async_gives_the_synchronous_tokens_and_logprobs_with_graphs(device):
    """bf16 tiny Llama, decode through CUDA graphs (the pending tokens are gathered into the graphs' static
    input ids before the replay) and eager mixed steps (chunked prefill, budget 16): async = sync, token for
    token, with seeded sampling, stop token ids, logprobs and prompt logprobs."""
    model = _model(device)
    params = [
        SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, logprobs=3, prompt_logprobs=2),
        SamplingParams(temperature=0.9, top_k=40, seed=7, max_tokens=12, ignore_eos=True, logprobs=1),
        SamplingParams(temperature=0.8, top_p=0.9, seed=8, max_tokens=12, stop_token_ids=[3, 77, 300]),
        SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=1),
        SamplingParams(temperature=0.0, max_tokens=9, ignore_eos=True),
    ]
    got = {}
    for overlap in (False, True):
        llm = LLM(
            device=device,
            loaded=(model, None, CONFIG),
            dtype=torch.bfloat16,
            max_num_seqs=8,
            max_num_batched_tokens=16,
            max_model_len=128,
            num_kv_blocks=64,
            async_scheduling=overlap,
        )
        assert llm.engine.runner.graphs.graphs
        got[overlap] = llm.generate(PROMPTS, params, use_tqdm=False)
        pool = llm.engine.scheduler.kv.pool
        assert pool.num_free_blocks == pool.num_blocks - 1
    sync, overlapped = got[False], got[True]
    assert [o.token_ids for o in overlapped] == [o.token_ids for o in sync]
    assert [o.finish_reason for o in overlapped] == [o.finish_reason for o in sync]
    for a, b in zip(overlapped, sync, strict=True):
        for x, y in ((a.logprobs, b.logprobs), (a.prompt_logprobs, b.prompt_logprobs)):
            assert (x is None) == (y is None)
            if x is not None:
                assert [e and e.token_id for e in x] == [e and e.token_id for e in y]
                # Both runs read bf16 logits of the same kernels; a batch that differs (a request finished by a
                # stop token still has its next row in flight under async) may round a logit differently.
                assert_agree(families.LLAMA_KERNELS, _values(x), _values(y), "async vs sync logprobs")


def _values(entries) -> torch.Tensor:
    return torch.tensor([[e.logprob, *e.top_logprobs] for e in entries if e is not None])
