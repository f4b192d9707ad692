"""Host overhead of the engine's decode step, without a GPU.

    python -m bench.llm.host_overhead                      # 256 rows, 200 timed decode steps, async on and off
    python -m bench.llm.host_overhead --rows 64 --steps 50 --async-only
    python -m bench.llm.host_overhead --no-fast-path         # every step through the scheduler's general path

The real LLM loop (runner.LLM: the engine core's step, the output processor, the abort of stopped requests),
scheduler and model runner, on the CPU, with a stand-in model whose forward and logits cost ~nothing: they
return slices of preallocated tensors (a tiny KV cache nobody reads; a 32-token vocabulary, because the greedy
argmax the host runs here in place of the GPU costs ~7 us over [256, 32] but ~74 us over [256, 512]; the
logits are one-hot on a fixed token, so every step samples it). `rows` requests of
W1's prompt lengths (100-1024 tokens, bench.llm.workload.W1), greedy, ignore_eos, W1's max_model_len (so
the block tables are W1's 97 blocks wide) and token budget, prefix caching and chunked prefill on; no
tokenizer (the H200 image holds none for W1's dummy shape). After the prompts are prefilled every request
decodes one token a step; the timed steps are calls of the loop whose every scheduled and resolved step
is a `rows`-row decode, after `--warmup` such calls.

Each phase is timed with perf_counter around the real method (instance attributes that wrap it; ~0.3 us a
call): schedule (Scheduler.schedule), launch (ModelRunner.launch: pack the inputs, queue forward, logits and
sampling, start the copies), collect (ModelRunner.collect: wait for and read the tokens), update
(Scheduler.update), deltas (EngineCore._deltas), output (OutputProcessor.process), other (the rest of the
loop's call: EngineCore's glue, load(), the abort check). On the CPU the "device" runs inside launch, so
launch holds the stand-in's few tensor ops (index, argmax, copy) as well as their launch cost.

Figures, ms per 256-row decode step (mean of 200 steps; a 2-core CPU shared with other jobs, torch 2.13 CPU,
one torch thread; two runs agree within ~5 %). The H200's host took ~3.8 ms a step on the code of the first
row (W1's host_ms_per_step, asynchronous scheduling): that host runs this Python ~2.5x slower and also
launches the step's CUDA work.

                          schedule  launch collect  update  deltas  output   other   total
    at 27709cb    sync       0.360   0.176   0.008   0.274   0.066   0.104   0.048   1.036
                  async      0.426   0.223   0.008   0.277   0.068   0.106   0.067   1.175
    at 6243f23    sync       0.099   0.066   0.003   0.082   0.033   0.060   0.023   0.365
                  async      0.109   0.065   0.003   0.084   0.034   0.062   0.028   0.385
    6243f23, --no-fast-path  sync 0.856, async 1.003 total (the numpy block table and the output
                  processor's path alone)
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import statistics
import sys
import time
from collections.abc import Callable

import torch

from bench.llm.workload import W1
from runner.model.config import LlamaConfig

VOCAB = 32  # small: the sampler's argmax over [rows, vocab] is "device" work, here run by the host
TOKEN = 7  # every step's greedy token (not the EOS id, which is VOCAB - 1; ignore_eos anyway)
PHASES = ("schedule", "launch", "collect", "update", "deltas", "output")


class StandInModel:
    """Forward and logits that cost ~nothing: views of preallocated tensors of the right shapes."""

    def __init__(self, config: LlamaConfig, max_tokens: int, max_rows: int):
        self.hidden = torch.zeros(max_tokens, config.hidden_size)
        self.logits = torch.zeros(max_rows, config.vocab_size)
        self.logits[:, TOKEN] = 1.0

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, batch, kv_caches) -> torch.Tensor:
        return self.hidden[: input_ids.shape[0]]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.logits[: hidden.shape[0]]


def stand_in_config() -> LlamaConfig:
    """One layer, one KV head of 8: a KV cache of W1's block count in ~25 MB."""
    return LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=8,
        intermediate_size=8,
        num_hidden_layers=1,
        num_attention_heads=1,
        num_key_value_heads=1,
        head_dim=8,
        max_position_embeddings=1 << 20,
        eos_token_id=VOCAB - 1,
    )


@dataclasses.dataclass
class _Call:
    """One call of the loop: seconds per phase, and the (rows, is_decode) of every step it scheduled or
    resolved."""

    seconds: dict[str, float] = dataclasses.field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    steps: list[tuple[int, bool]] = dataclasses.field(default_factory=list)
    total: float = 0.0


class _Timers:
    """Wraps the phases' methods on their instances; `call` is the record the wrappers add to."""

    def __init__(self):
        self.call = _Call()

    def wrap(self, owner: object, method: str, phase: str, step_arg: bool = False, step_result: bool = False):
        real: Callable = getattr(owner, method)
        now = time.perf_counter

        def timed(*args, **kwargs):
            started = now()
            result = real(*args, **kwargs)
            self.call.seconds[phase] += now() - started
            output = args[0] if step_arg else result if step_result else None
            if output is not None:  # num_rows: without building a decode step's row objects
                rows = output.num_rows if hasattr(output, "num_rows") else len(output.scheduled)
                self.call.steps.append((rows, output.is_decode))
            return result

        setattr(owner, method, timed)


def measure(rows: int, steps: int, warmup: int, async_scheduling: bool, fast_path: bool = True) -> list[_Call]:
    """The loop's steady `rows`-row decode calls: `steps` of them, after `warmup`."""
    from runner import LLM, SamplingParams
    from runner.engine.core_build import EngineConfig
    from runner.engine.messages import AddRequest

    workload = W1.scaled(requests=rows)
    config = stand_in_config()
    max_model_len = workload.max_input + workload.output_len + 16  # W1's (bench.llm.w1._cuda_llm)
    block_size, budget = 16, 16384
    engine = EngineConfig(
        device="cpu",
        dtype="float32",
        max_num_seqs=rows,
        max_num_batched_tokens=budget,
        max_model_len=max_model_len,
        block_size=block_size,
        num_kv_blocks=rows * -(-max_model_len // block_size) + 1,  # no preemption
        async_scheduling=async_scheduling,
        **({} if fast_path else {"decode_fast_path": False}),  # the option exists from the fast path on
    )
    llm = LLM(config=engine, loaded=(StandInModel(config, budget, rows), None, config))
    core, processor = llm.engine, llm.processor
    timers = _Timers()
    timers.wrap(core.scheduler, "schedule", "schedule", step_result=True)
    timers.wrap(core.runner, "launch", "launch")
    timers.wrap(core.runner, "collect", "collect")
    timers.wrap(core.scheduler, "update", "update", step_arg=True)
    timers.wrap(core, "_deltas", "deltas")
    timers.wrap(processor, "process", "output")

    # Enough tokens that the timed calls never meet a request's end (a prompt takes a few calls to prefill).
    params = SamplingParams(temperature=0.0, max_tokens=warmup + steps + 64, ignore_eos=True)
    prompts = workload.prompts(VOCAB)
    left = set()
    for i, prompt in enumerate(prompts):
        request_id = str(i)
        processor.add(request_id, prompt, params)
        core.add_request(AddRequest(request_id, prompt, params))
        left.add(request_id)

    steady: list[_Call] = []
    now = time.perf_counter
    gc.disable()  # as LLM.generate does (runner.llm._gc_paused)
    try:
        while left and len(steady) < warmup + steps:
            timers.call = call = _Call()
            started = now()
            step = core.step()  # the body of LLM.generate's loop
            updates, stopped = processor.process(step)
            if stopped:
                core.abort(stopped)
            for update in updates:
                if update.finish_reason is not None:
                    left.discard(update.request_id)
            call.total = now() - started
            if call.steps and all(n == rows and decode for n, decode in call.steps):
                steady.append(call)
    finally:
        gc.enable()
    if len(steady) < warmup + steps:
        raise RuntimeError(f"only {len(steady)} steady decode calls (wanted {warmup + steps})")
    for check in steady[warmup:]:  # one launch and one resolve a call: a call is one step's worth of work
        if len(check.steps) != 2:
            raise RuntimeError(f"a steady call scheduled and resolved {check.steps}")
    return steady[warmup:]


def summary(calls: list[_Call]) -> dict[str, float]:
    """Milliseconds per call: the mean of each phase, `other`, the mean and median total."""
    ms = {p: statistics.fmean(c.seconds[p] for c in calls) * 1e3 for p in PHASES}
    totals = [c.total * 1e3 for c in calls]
    ms["other"] = statistics.fmean(totals) - sum(ms[p] for p in PHASES)
    ms["total"] = statistics.fmean(totals)
    ms["median"] = statistics.median(totals)
    return ms


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.llm.host_overhead", description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=256, help="running requests, all decoding (max_num_seqs)")
    p.add_argument("--steps", type=int, default=200, help="timed decode steps")
    p.add_argument("--warmup", type=int, default=20, help="steady decode steps before the timed ones")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--async-only", action="store_true", help="only asynchronous scheduling")
    which.add_argument("--sync-only", action="store_true", help="only synchronous scheduling")
    p.add_argument("--no-fast-path", action="store_true", help="the scheduler's decode fast path off")
    args = p.parse_args(argv)
    if args.rows < 1 or args.steps < 1 or args.warmup < 0:
        p.error("--rows and --steps must be >= 1, --warmup >= 0")
    # One torch thread: the host path's tensor ops are tiny, and a thread pool contending for a shared
    # machine's cores only adds noise.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        modes = [False] if args.sync_only else [True] if args.async_only else [False, True]
        columns = (*PHASES, "other", "total", "median")
        print(f"host ms per {args.rows}-row decode step, mean of {args.steps} steps (median total last)")
        print(f"{'':>6} " + " ".join(f"{c:>8}" for c in columns))
        for overlap in modes:
            ms = summary(measure(args.rows, args.steps, args.warmup, overlap, not args.no_fast_path))
            print(f"{'async' if overlap else 'sync':>6} " + " ".join(f"{ms[c]:8.3f}" for c in columns))
    finally:
        torch.set_num_threads(threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
