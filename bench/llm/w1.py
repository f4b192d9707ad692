"""W1: offline throughput of runner.LLM against transformers continuous batching, same workload, same run.

    python -m bench.llm.w1                                  # H200: 256 requests x 512 tokens, bf16, dummy weights
    python -m bench.llm.w1 --requests 16 --output-len 32    # smoke run
    python -m bench.llm.w1 --cpu                            # CPU: the real model vs HF generate, 8 x 32

Workload (bench.llm.workload.W1): 256 prompts of random token ids, lengths uniform in [100, 1024] (seed
0), 512 output tokens each (ignore_eos, greedy), SmolLM2-135M's shape with dummy weights in bf16 on CUDA.
Metric: output tokens / wall seconds of `generate` (prefill included, nano-vllm's bench.py definition), after one
small warm-up generate (CUDA graphs are captured when the LLM is built, outside the timing). Bars on the H200:
>= 70,000 output tok/s and >= 75x HF `generate_batch` in the same run, on every seed asked for (`--seeds 0,1`:
each seed its own prompts, its own touchstone row and its own HF row). `--sync-row` adds a row of the same
engine with asynchronous scheduling off (seed 0): the step-time figure before the overlap.

The per-step split (schedule / prepare / model / sample / postprocess, summed over steps) comes from a
second run of the same shape (prompts of seed + 100, so nothing hits a timed run's prefix cache) with phase
timing on (it synchronizes the GPU between phases and so also turns the overlap of asynchronous scheduling
off: its total is longer; the throughput rows are the runs without it).

Peer: transformers `generate_batch` (continuous batching, paged|sdpa attention, block size 256, KV sized by
HF from free memory), the same prompts and a model of the same shape with random weights. Its tok/s is
reported twice: over the whole call (which includes HF's own warm-up / graph capture) and over the request
span (first request created -> last finished). On CPU the peer is plain `generate` one prompt at a time, with
the real GGUF weights; there the greedy tokens of both are also compared.

Other shapes (`--model qwen3-30b-a3b-shape`: the MoE layer in every decoder layer) run the same workload and
write their own report, runner_w1_<model>.*; the bars are SmolLM2-135M's and are not applied to them.

Writes reports/<backend>-<device>/runner_w1.csv and .md (runner_cpu_real.* for --cpu).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import pathlib
import sys
import time

import torch

from bench.environment import collect
from bench.llm import hf_peer, report
from bench.llm.workload import CPU_REAL, W1, Workload
from runner.cli_checks import number_list

BAR_TOK_S = 70_000
BAR_X_HF = 75.0
BAR_MODEL = "smollm2-135m"  # the shape the bars were set on


def _our_row(
    workload: Workload, llm, prompts: list[list[int]], note: str, impl: str = "touchstone", phases: bool = True
) -> tuple[dict, list[list[int]]]:
    """Timed generate of `prompts`; the warm-up and the phase-timed rerun use prompts of other seeds, so no
    run finds the timed prompts in the prefix cache."""
    from runner import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=workload.output_len, ignore_eos=True)
    vocab = llm.config.vocab_size
    warm = dataclasses.replace(workload, requests=2, seed=workload.seed + 1000).prompts(vocab)
    llm.generate(warm, dataclasses.replace(params, max_tokens=4), use_tqdm=False)
    sync = torch.cuda.synchronize if llm.device.type == "cuda" else (lambda: None)
    engine = llm.engine
    engine.stats = type(engine.stats)()
    engine.runner.gpu_timing = llm.device.type == "cuda"
    sync()
    started = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    sync()
    seconds = time.perf_counter() - started
    engine.runner.gpu_timing = False
    timed = engine.stats
    tokens = sum(len(o.token_ids) for o in outs)
    engine.stats = type(engine.stats)()
    if phases:
        engine.time_phases = True
        llm.generate(dataclasses.replace(workload, seed=workload.seed + 100).prompts(vocab), params, use_tqdm=False)
        engine.time_phases = False
    s = engine.stats
    row = dict(
        workload=workload.name,
        impl=impl,
        requests=len(prompts),
        input_tokens=sum(map(len, prompts)),
        output_tokens=tokens,
        seconds=seconds,
        output_tok_per_s=tokens / seconds,
        timed_steps=timed.steps,
        gpu_ms_per_step=timed.gpu_s / max(timed.steps, 1) * 1e3,
        host_ms_per_step=(seconds - timed.collect_s) / max(timed.steps, 1) * 1e3,
        wait_ms_per_step=timed.collect_s / max(timed.steps, 1) * 1e3,
        steps=s.steps,
        schedule_s=s.schedule_s,
        prepare_s=s.prepare_s,
        model_s=s.model_s,
        sample_s=s.sample_s,
        postprocess_s=s.postprocess_s,
        note=f"{note}; seed {workload.seed}"
        + (
            f"; steps and split from a rerun with phase sync, prompts of seed {workload.seed + 100} "
            f"({s.decode_steps} decode steps)"
            if phases
            else ""
        ),
    )
    return row, [o.token_ids for o in outs]


def _peer_rows(workload: Workload, result: dict, prompts: list[list[int]], impl: str, note: str) -> list[dict]:
    base = dict(
        workload=workload.name,
        requests=len(prompts),
        input_tokens=sum(map(len, prompts)),
        output_tokens=result["tokens"],
    )
    hf_peer.check(result, impl)  # a failed peer raises: never a 0 tok/s row
    rows = [
        dict(base, impl=impl, seconds=result["wall"], output_tok_per_s=result["tokens"] / result["wall"], note=note)
    ]
    if result["span"] != result["wall"]:
        rows.append(
            dict(
                base,
                impl=impl + " (request span)",
                seconds=result["span"],
                output_tok_per_s=result["tokens"] / result["span"],
                note="excludes HF's warm-up",
            )
        )
    return rows


def _progress(row: dict) -> None:
    """A measured row, printed at once: a run cut short by a time limit still shows what it measured."""
    split = "".join(
        f", {row[k]:.2f} ms {k.removesuffix('_ms_per_step')}/step"
        for k in ("gpu_ms_per_step", "host_ms_per_step", "wait_ms_per_step")
        if k in row
    )
    print(f"{row['impl']} ({row['note'][-7:]}): {row['output_tok_per_s']:,.0f} tok/s{split}", flush=True)


def _cuda_llm(workload: Workload, args: argparse.Namespace, **engine):
    from runner import LLM

    return LLM(
        args.model,
        load_format="dummy",
        dtype=torch.bfloat16,
        device="cuda",
        max_num_seqs=min(args.max_num_seqs, workload.requests),
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=workload.max_input + workload.output_len + 16,
        enforce_eager=args.eager,
        **engine,
    )


def run_cuda(workload: Workload, args: argparse.Namespace) -> tuple[list[dict], str]:
    seeds = args.seeds
    runs: list[tuple[Workload, dict]] = []
    llm = _cuda_llm(workload, args)
    note = (
        f"bf16 dummy {args.model}, {len(llm.engine.runner.graphs.graphs)} decode graphs, "
        f"{llm.engine.scheduler.config.num_blocks} KV blocks"
    )
    for i, seed in enumerate(seeds):
        seeded = dataclasses.replace(workload, seed=seed)
        ours, _ = _our_row(seeded, llm, seeded.prompts(llm.config.vocab_size), note, phases=i == 0)
        runs.append((seeded, ours))
        _progress(ours)
    config = llm.config
    del llm
    gc.collect()
    torch.cuda.empty_cache()
    rows = [ours for _, ours in runs]
    if args.sync_row:
        llm = _cuda_llm(workload, args, async_scheduling=False)
        seeded = dataclasses.replace(workload, seed=seeds[0])
        sync, _ = _our_row(seeded, llm, seeded.prompts(config.vocab_size), note, "touchstone (sync scheduling)")
        rows.append(sync)
        del llm
        gc.collect()
        torch.cuda.empty_cache()
    verdicts = []
    for seeded, ours in runs:
        verdict = f"seed {seeded.seed}: {ours['output_tok_per_s']:,.0f} output tok/s"
        if not args.no_peer:
            model = hf_peer.dummy_model(config, torch.bfloat16, "cuda")
            prompts = seeded.prompts(config.vocab_size)
            result = hf_peer.generate_batch(model, prompts, seeded.output_len)
            peer = _peer_rows(
                seeded,
                result,
                prompts,
                "hf generate_batch",
                f"transformers CB, {model.config._attn_implementation}"
                + (f", {model.config._experts_implementation} experts" if config.model_type != "llama" else "")
                + f", bf16 random weights, seed {seeded.seed}",
            )
            rows += peer
            for row in peer:
                _progress(row)
            ratio = ours["output_tok_per_s"] / peer[0]["output_tok_per_s"]
            verdict += f" = {ratio:.1f}x HF generate_batch"
            del model
            gc.collect()
            torch.cuda.empty_cache()
        if args.model == BAR_MODEL:
            met = ours["output_tok_per_s"] >= BAR_TOK_S and (args.no_peer or ratio >= BAR_X_HF)
            verdict += f" ({'meets' if met else 'below'} the bars)"
        verdicts.append(verdict)
    if args.model != BAR_MODEL:
        return rows, f"touchstone W1 workload on the {args.model} shape: " + "; ".join(verdicts) + "."
    return rows, f"touchstone W1 ({BAR_TOK_S:,} tok/s and {BAR_X_HF:g}x HF bars): " + "; ".join(verdicts) + "."


def run_cpu(workload: Workload, args: argparse.Namespace) -> tuple[list[dict], str]:
    from runner import LLM

    llm = LLM(device="cpu", max_num_seqs=workload.requests)
    prompts = workload.prompts(llm.config.vocab_size)
    ours, tokens = _our_row(workload, llm, prompts, "fp32 SmolLM2-135M-Instruct GGUF (dequantized)")
    rows = [ours]
    headline = f"touchstone: {ours['output_tok_per_s']:,.1f} output tok/s on CPU."
    if not args.no_peer:
        from runner.model import gguf_path

        model = hf_peer.gguf_model(str(gguf_path("smollm2-135m-instruct")), torch.float32)
        result = hf_peer.generate_greedy(model, prompts, workload.output_len)
        same = sum(a == b for a, b in zip(tokens, result["token_ids"], strict=True))
        rows += _peer_rows(
            workload,
            result,
            prompts,
            "hf generate",
            f"transformers generate one prompt at a time, fp32; {same}/{len(prompts)} requests "
            f"with identical greedy tokens",
        )
        headline += f" Greedy tokens equal HF's for {same}/{len(prompts)} requests."
        # The batched peer: HF continuous batching on the same weights (paged|sdpa). On the CPU HF cannot size
        # its cache from free memory: blocks of 16 for every request's prompt + output, a budget of 512 tokens.
        model.set_attn_implementation("paged|sdpa")
        blocks = len(prompts) * -(-(workload.max_input + workload.output_len) // 16)
        batched = hf_peer.generate_batch(
            model, prompts, workload.output_len, block_size=16, num_blocks=blocks, max_batch_tokens=512
        )
        same_cb = sum(a == b for a, b in zip(tokens, batched["token_ids"], strict=True))
        rows += _peer_rows(
            workload,
            batched,
            prompts,
            "hf generate_batch",
            f"transformers continuous batching, paged|sdpa, fp32; {same_cb}/{len(prompts)} requests "
            f"with identical greedy tokens",
        )
        ratio = ours["output_tok_per_s"] / (batched["tokens"] / batched["wall"])
        headline += f" {ratio:.2f}x HF continuous batching (whole call) in the same run."
    return rows, headline


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.llm.w1", description=__doc__.split("\n\n")[0])
    p.add_argument("--cpu", action="store_true", help="the CPU variant: real model vs HF generate (8 x 32)")
    p.add_argument("--requests", type=int, help="scale down the number of requests (smoke runs)")
    p.add_argument("--output-len", type=int, help="scale down the output tokens per request")
    p.add_argument("--model", default="smollm2-135m", help="registered shape for the dummy weights (CUDA)")
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=16384)
    p.add_argument("--eager", action="store_true", help="no CUDA graphs")
    p.add_argument("--no-peer", action="store_true", help="skip the transformers run")
    seeds = number_list(int, lambda v: v >= 0, "a comma-separated list of seeds >= 0")
    p.add_argument("--seeds", type=seeds, default=[0], help="prompt seeds, e.g. 0,1 (default 0)")
    p.add_argument("--sync-row", action="store_true", help="also run seed 0 with asynchronous scheduling off")
    p.add_argument("--out", type=pathlib.Path, default=pathlib.Path("reports"))
    args = p.parse_args(argv)
    workload = (CPU_REAL if args.cpu else W1).scaled(args.requests, args.output_len)
    if not args.cpu and not torch.cuda.is_available():
        print("W1 needs CUDA (use --cpu for the CPU variant)", file=sys.stderr)
        return 2
    rows, headline = run_cpu(workload, args) if args.cpu else run_cuda(workload, args)
    env = collect()
    name = f"runner_{workload.name.replace('-', '_')}"
    if not args.cpu and args.model != BAR_MODEL:
        name += "_" + args.model.replace("-", "_")
    folder = report.write(args.out, env, name, rows, headline)
    for row in rows:
        print(
            f"{row['impl']:>32}: {row['output_tokens']} tokens in {row['seconds']:.2f} s = "
            f"{row['output_tok_per_s']:,.1f} tok/s"
        )
    print(headline)
    print(f"wrote {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
