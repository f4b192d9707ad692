"""Sweep the runner's engine knobs on W1 (GPU): output tok/s per configuration, and the ratio to the W1 bar
(40,000 tok/s).

    python -m bench.llm.w1_launch_sweep [--requests 256 --output-len 512]

Knobs: the step token budget (max_num_batched_tokens: prefill chunk size, so how many steps the 256 prompts
take), max_num_seqs (the decode batch; 256 = the whole workload at once) and CUDA graphs on/off; this sweep
is what sets the defaults of bench.llm.w1. Each configuration builds its own LLM (dummy bf16 weights, its own
graph capture, its own KV sizing), runs one small warm-up generate and one timed generate of the workload.
"""

from __future__ import annotations

import dataclasses
import gc
import itertools
import sys
import time

import torch

from bench.launch_sweep import gpu_args, note, parser
from bench.llm.w1 import BAR_TOK_S
from bench.llm.workload import W1

BUDGETS = (8192, 16384, 32768)
SEQS = (128, 256)
GRAPHS = (True, False)


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__)
    p.add_argument("--requests", type=int)
    p.add_argument("--output-len", type=int)
    p.add_argument("--model", default="smollm2-135m")
    args = gpu_args(p, argv, "w1_launch_sweep")
    from runner import LLM, SamplingParams

    workload = W1.scaled(args.requests, args.output_len)
    params = SamplingParams(temperature=0.0, max_tokens=workload.output_len, ignore_eos=True)
    prompts = None
    for budget, seqs, graphs in itertools.product(BUDGETS, SEQS, GRAPHS):
        llm = LLM(
            args.model,
            load_format="dummy",
            dtype=torch.bfloat16,
            device="cuda",
            max_num_seqs=seqs,
            max_num_batched_tokens=budget,
            max_model_len=workload.max_input + workload.output_len + 16,
            enforce_eager=not graphs,
        )
        prompts = prompts or workload.prompts(llm.config.vocab_size)
        warm = dataclasses.replace(workload, requests=2, seed=workload.seed + 2).prompts(llm.config.vocab_size)
        llm.generate(warm, SamplingParams(temperature=0.0, max_tokens=4), use_tqdm=False)  # no prefix hits later
        llm.engine.stats = type(llm.engine.stats)()  # steps printed below: the timed run's only
        preempted = llm.engine.scheduler.num_preemptions
        torch.cuda.synchronize()
        started = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - started
        tokens = sum(len(o.token_ids) for o in outs)
        rate = tokens / seconds
        config = f"budget={budget:>6} seqs={seqs:>4} graphs={graphs!s:>5}"
        steps, preemptions = llm.engine.stats.steps, llm.engine.scheduler.num_preemptions - preempted
        note(
            config,
            f"{config} steps={steps:>5} preempted={preemptions:>4}: {seconds:7.3f} s {rate:>10,.0f} tok/s "
            f"({rate / BAR_TOK_S:.2f}x bar)",
            seconds=seconds,
            output_tok_per_s=rate,
            steps=steps,
            preemptions=preemptions,
            x_bar=rate / BAR_TOK_S,
        )
        del llm
        gc.collect()
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
