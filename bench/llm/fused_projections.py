"""What the q/k/v and gate/up fusion buys: `python -m bench.llm.fused_projections` (H200, dummy weights, bf16).

Two measurements, each fused against unfused in the same run:
- per layer: the input projections of one decoder layer of Llama-3.1-8B's shape (qkv_proj + gate_up_proj, as
  the model runs them, against q/k/v_proj and gate/up_proj as separate GEMMs), CUDA-graph replays
  (`triton.testing.do_bench_cudagraph`) at M = 1 ... 4096 tokens;
- end to end: W1 (`bench.llm.w1`'s workload, SmolLM2-135M's shape, seed 0) output tok/s with every fused layer
  of the model split back into its parts.
The unfused model keeps the fused layer's interface (one output tensor, split after): its parts' outputs are
concatenated, one extra copy of the layer's output that a model written unfused would not make."""

from __future__ import annotations

import argparse
import functools
import gc
import pathlib
import sys
import time

import torch
import torch.nn.functional as F

from bench import tables

COLUMNS = ("measure", "shape", "tokens", "fused", "unfused", "fused_speedup", "device", "torch", "git_sha", "command")
TOKENS = (1, 8, 32, 64, 256, 1024, 4096)


def unfuse(model: torch.nn.Module) -> int:
    """Run every fused linear layer of `model` as separate GEMMs, one per part (its rows, copied); returns the
    number of layers changed."""
    from runner.model.layers import FusedLinear

    changed = 0
    for module in model.modules():
        if not isinstance(module, FusedLinear):
            continue
        parts = _parts(module)
        module.forward = lambda x, parts=parts: torch.cat([F.linear(x, w) for w in parts], dim=-1)
        changed += 1
    return changed


def _parts(module) -> list[torch.Tensor]:
    """A fused layer's weight as its parts' weights (row blocks, copied into their own tensors)."""
    return [w.clone() for w in module.weight.split(list(module.shard_sizes.values()))]


def per_layer(model_name: str) -> list[dict]:
    from triton.testing import do_bench_cudagraph

    from runner.model import load_model

    model, _, config = load_model(model_name, "dummy", torch.bfloat16, "cuda", tokenizer=False)
    layer = model.model.layers[0]
    fused = [layer.self_attn.qkv_proj, layer.mlp.gate_up_proj]
    split = [w for m in fused for w in _parts(m)]
    rows = []
    for m in TOKENS:
        x = torch.randn(m, config.hidden_size, dtype=torch.bfloat16, device="cuda")

        def run_fused(x=x):
            for module in fused:
                module(x)

        def run_split(x=x):
            for w in split:
                F.linear(x, w)

        a = do_bench_cudagraph(run_fused, rep=50)
        b = do_bench_cudagraph(run_split, rep=50)
        rows.append(
            {
                "measure": "layer projections (us)",
                "shape": f"{model_name}: qkv + gate_up",
                "tokens": m,
                "fused": a * 1e3,
                "unfused": b * 1e3,
                "fused_speedup": b / a,
            }
        )
        print(f"  {m} tokens: fused {a * 1e3:.1f} us, unfused {b * 1e3:.1f} us ({b / a:.2f}x)", flush=True)
    del model, layer
    gc.collect()
    torch.cuda.empty_cache()
    return rows


def w1_rate(fused: bool) -> float:
    from bench.llm.workload import W1
    from runner import LLM, SamplingParams
    from runner.model import load_model

    loaded = load_model("smollm2-135m", "dummy", torch.bfloat16, "cuda", tokenizer=False)
    if not fused:
        unfuse(loaded[0])
    llm = LLM(
        loaded=loaded,
        device="cuda",
        dtype="bfloat16",
        max_num_seqs=256,
        max_num_batched_tokens=16384,
        max_model_len=W1.max_input + W1.output_len + 16,
    )
    prompts = W1.prompts(loaded[2].vocab_size)
    llm.generate(prompts[:4], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), use_tqdm=False)
    params = SamplingParams(temperature=0, max_tokens=W1.output_len, ignore_eos=True)
    torch.cuda.synchronize()
    started = time.perf_counter()
    llm.generate(prompts, params, use_tqdm=False)
    torch.cuda.synchronize()
    rate = W1.requests * W1.output_len / (time.perf_counter() - started)
    llm.close()
    del llm, loaded
    gc.collect()
    torch.cuda.empty_cache()
    return rate


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.llm.fused_projections", description=__doc__.split("\n")[0])
    p.add_argument("--model", default="llama-3.1-8b-shape")
    p.add_argument("--out", type=pathlib.Path, default=pathlib.Path("reports"))
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        p.error("needs a CUDA GPU")
    from bench.environment import collect
    from bench.llm.weights_plot import plot_fused

    env = collect()
    print(f"fused_projections: {args.model} layer projections, then W1", flush=True)
    rows = per_layer(args.model)
    fused, unfused = w1_rate(True), w1_rate(False)
    print(f"  W1: fused {fused:,.0f} tok/s, unfused {unfused:,.0f} tok/s", flush=True)
    rows.append(
        {
            "measure": "W1 output tok/s",
            "shape": "smollm2-135m",
            "tokens": 256 * 512,
            "fused": fused,
            "unfused": unfused,
            "fused_speedup": fused / unfused,
        }
    )
    command = tables.command_line("python -m bench.llm.fused_projections", argv)
    at = {r["tokens"]: r["fused_speedup"] for r in rows[:-1]}
    headline = (
        f"Fused q/k/v and gate/up: {args.model} layer projections {at[1]:.2f}x faster than separate GEMMs at 1 "
        f"token, {at[64]:.2f}x at 64, {at[4096]:.2f}x at 4096; W1 {fused / unfused:.3f}x the unfused model's tok/s."
    )
    plot = functools.partial(plot_fused, rows=rows, title=headline)
    folder = tables.write_report(
        args.out, env, "fused_projections", rows, COLUMNS, COLUMNS[:6], headline, {"command": command}, plot=plot
    )
    print(headline)
    print(f"wrote {folder}/fused_projections.csv, .md, .png", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
