"""The quantized runner on the GPU: `python -m bench.llm.quant_decode` (H200; Llama-3.1-8B's shape, dummy weights).

For bf16 and each online scheme (`LLM(..., quantization=...)`), in one run and one process (and, as
"mxfp4_w4a4" / "nvfp4_w4a4", a W4A4 FP4 checkpoint's layers: the online FP4 weights run through the checkpoint
scheme, each layer's input fake-quantized first, `runner.model.quant.fp4_w4a4`):
- decode: B requests of 32 prompt tokens and 256 greedy output tokens (ignore_eos), B = 1, 8, 32; output tok/s
  of the whole `generate` (decode-dominated: 256 CUDA-graph decode steps against one prefill step);
- prefill: 8 requests of 2048 prompt tokens, 1 output token: prompt tok/s;
- the load: peak GPU memory while the weights load and quantize (`torch.cuda.max_memory_allocated`) beside
  the quantized model's own bytes and its largest linear layer's bf16 weight (the LM head, which stays bf16;
  the load holds one checkpoint tensor in flight, and the LM head's is the largest), with the largest
  quantized layer's (gate_up) beside it.
Each scheme's figures are ratios to bf16's of the same run. Writes reports/<backend>-<slug>/quant_decode.*."""

from __future__ import annotations

import argparse
import functools
import gc
import pathlib
import random
import sys
import time

import torch

from bench import tables

COLUMNS = (
    "scheme",
    "workload",
    "batch",
    "tok_per_s",
    "vs_bf16",
    "load_peak_gib",
    "model_gib",
    "largest_layer_bf16_gib",
    "peak_over_model_vs_largest",
    "largest_quantized_layer_bf16_gib",
    *tables.RUN_COLUMNS,
)
SCHEMES = (None, "fp8_block", "mxfp4", "fp8")
# W4A4 checkpoint schemes -> the online scheme whose stored weights they read
W4A4 = {"mxfp4_w4a4": "mxfp4", "nvfp4_w4a4": "nvfp4"}
W4A4_INPUT_AMAX = 16.0  # the dummy nvfp4_w4a4 input global scale's amax (a calibrated one is per layer)


def _gib(n: int) -> float:
    return n / 2**30


def as_w4a4(model, scheme: str) -> int:
    """Give every linear layer of the online `W4A4[scheme]` scheme the W4A4 checkpoint scheme `scheme` (the same
    stored weights; nvfp4_w4a4 with a static input global scale of amax W4A4_INPUT_AMAX); returns how many."""
    from reference.quant.nvfp4_global_scale import DecodeScale
    from runner.model.layers import Linear
    from runner.model.quant.fp4_w4a4 import Mxfp4W4A4, Nvfp4W4A4

    layers = [m for m in model.modules() if isinstance(m, Linear) and m.scheme.name == W4A4[scheme]]
    for layer in layers:
        layer.scheme = Mxfp4W4A4() if scheme == "mxfp4_w4a4" else Nvfp4W4A4()
        if scheme == "nvfp4_w4a4":
            scale = DecodeScale.from_amax(W4A4_INPUT_AMAX).value.to(layer.weight_scale_2.device)
            layer.register_buffer("input_global_scale", scale)
    return len(layers)


def measure(model_name: str, scheme: str | None, batches: list[int], output_len: int) -> list[dict]:
    from runner import LLM, SamplingParams
    from runner.model import load_model

    name = scheme or "bf16"
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    online = W4A4.get(scheme, scheme)
    loaded = load_model(model_name, "dummy", torch.bfloat16, "cuda", tokenizer=False, quantization=online)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    model = loaded[0]
    if scheme in W4A4:
        as_w4a4(model, scheme)
    size = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    cfg = loaded[2]
    gate_up = 2 * cfg.intermediate_size * cfg.hidden_size * 2
    largest = max(gate_up, cfg.vocab_size * cfg.hidden_size * 2)
    memory = {
        "load_peak_gib": _gib(peak),
        "model_gib": _gib(size),
        "largest_layer_bf16_gib": _gib(largest),
        "peak_over_model_vs_largest": (peak - size) / largest,
        "largest_quantized_layer_bf16_gib": _gib(gate_up),
    }
    print(f"  {name}: loaded, peak {_gib(peak):.2f} GiB, model {_gib(size):.2f} GiB", flush=True)
    llm = LLM(
        loaded=loaded, device="cuda", dtype="bfloat16", max_model_len=4096, max_num_seqs=64, kv_cache_bytes=16 << 30
    )
    rng = random.Random(0)

    def prompts(n: int, length: int) -> list[list[int]]:
        return [[rng.randrange(1000, 100000) for _ in range(length)] for _ in range(n)]

    llm.generate(prompts(2, 32), SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), use_tqdm=False)
    rows = []
    for b in batches:
        params = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)
        torch.cuda.synchronize()
        started = time.perf_counter()
        llm.generate(prompts(b, 32), params, use_tqdm=False)
        torch.cuda.synchronize()
        rate = b * output_len / (time.perf_counter() - started)
        rows.append({"scheme": name, "workload": "decode", "batch": b, "tok_per_s": rate, **memory})
        print(f"  {name}: decode batch {b}: {rate:,.0f} output tok/s", flush=True)
    one = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    long = prompts(8, 2048)
    llm.generate(long[:1], one, use_tqdm=False)
    torch.cuda.synchronize()
    started = time.perf_counter()
    llm.generate(long, one, use_tqdm=False)
    torch.cuda.synchronize()
    rate = 8 * 2048 / (time.perf_counter() - started)
    rows.append({"scheme": name, "workload": "prefill 8 x 2048", "batch": 8, "tok_per_s": rate, **memory})
    print(f"  {name}: prefill 8 x 2048: {rate:,.0f} prompt tok/s", flush=True)
    llm.close()
    del llm, loaded, model
    gc.collect()
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.llm.quant_decode", description=__doc__.split("\n")[0])
    p.add_argument("--model", default="llama-3.1-8b-shape")
    p.add_argument("--batches", default="1,8,32")
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument(
        "--schemes",
        default="bf16,fp8_block,mxfp4,fp8",
        help="comma-separated: bf16, online schemes (fp8, fp8_block, mxfp4, nvfp4), mxfp4_w4a4, nvfp4_w4a4",
    )
    p.add_argument("--out", type=pathlib.Path, default=pathlib.Path("reports"))
    p.add_argument("--name", default="quant_decode", help="report name (a run of some schemes: its own report)")
    args = p.parse_args(argv)
    if "bf16" not in args.schemes.split(","):
        p.error("--schemes must include bf16: every ratio is against it")
    if not torch.cuda.is_available():
        p.error("needs a CUDA GPU")
    from bench.environment import collect
    from bench.llm.quant_plot import plot_decode

    env = collect()
    batches = [int(b) for b in args.batches.split(",")]
    schemes = [None if s == "bf16" else s for s in args.schemes.split(",")]
    print(f"quant_decode: {args.model}, dummy weights; schemes {args.schemes}; batches {batches}", flush=True)
    rows = []
    for scheme in schemes:
        rows += measure(args.model, scheme, batches, args.output_len)
    bf16 = {(r["workload"], r["batch"]): r["tok_per_s"] for r in rows if r["scheme"] == "bf16"}
    for r in rows:
        ref = bf16.get((r["workload"], r["batch"]))
        r["vs_bf16"] = r["tok_per_s"] / ref if ref else float("nan")
    command = tables.command_line("python -m bench.llm.quant_decode", argv)
    pick = {(r["scheme"], r["workload"], r["batch"]): r["vs_bf16"] for r in rows}
    # The bars' figures, for the schemes this run measured (a run of some schemes names only those).
    bar_figures = (
        ("mxfp4", "decode", 1, "at batch 1"),
        ("mxfp4", "decode", 8, "at batch 8"),
        ("fp8_block", "decode", 1, "at batch 1"),
        ("fp8_block", "prefill 8 x 2048", 8, "prefill 8 x 2048"),
    )
    measured = {}
    for scheme, workload, batch, label in bar_figures:
        if (scheme, workload, batch) in pick:
            measured.setdefault(scheme, []).append(f"{pick[scheme, workload, batch]:.2f}x {label}")
    ratios = "; ".join(f"{scheme} " + " and ".join(parts) for scheme, parts in measured.items())
    first_decode = [r for r in rows if r["workload"] == "decode" and r["batch"] == batches[0]]  # one row a scheme
    headline = (
        f"{args.model}, dummy weights: output tok/s vs bf16 in the same run: {ratios or 'none of the bar figures'}"
        ". Online quantization's load peak above the quantized model, in units of the largest layer's bf16 "
        "weight: " + ", ".join(f"{r['scheme']} {r['peak_over_model_vs_largest']:.2f}" for r in first_decode) + "."
    )
    plot = functools.partial(plot_decode, rows=rows)
    folder = tables.write_report(
        args.out, env, args.name, rows, COLUMNS, COLUMNS[:9], headline, {"command": command}, plot=plot
    )
    print(headline)
    print(f"wrote {folder}/{args.name}.csv, .md, .png", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
