"""Weight offload on the GPU: `python -m bench.llm.offload_decode` (H200; Llama-3.1-8B's shape, dummy weights).

Decode of B requests (32 prompt tokens, 128 greedy output tokens, ignore_eos) with every weight on the GPU,
then with `prefetch` offload of half the decoder layers (`cpu_offload_gb` = 16 of 32 layers' bytes), then with
`uva` offload of as many (the GPU reading them in host memory), in one process. Beside them, the same run's
pinned host-to-device copy bandwidth (`triton.testing.do_bench` of one copy of an offloaded layer's size) and the
step time that bandwidth allows: every decode step moves every offloaded layer across the host link once (a copy,
or the GPU's reads), so offloaded bytes / bandwidth is a floor under the offloaded step, whatever the overlap.
Writes reports/<backend>-<slug>/offload_decode.*."""

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
    "offload",
    "batch",
    "offloaded_layers",
    "offloaded_gib",
    "tok_per_s",
    "vs_resident",
    "h2d_gib_per_s",
    "step_ms",
    "copy_floor_ms",
    *tables.RUN_COLUMNS,
)


def h2d_bandwidth(nbytes: int) -> float:
    """GiB/s of one pinned host -> device copy of `nbytes` (median of triton.testing.do_bench)."""
    from triton.testing import do_bench

    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    device = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    ms = do_bench(lambda: device.copy_(host, non_blocking=True), warmup=5, rep=50, return_mode="median")
    return nbytes / 2**30 / (ms / 1e3)


def decode(model_name: str, batch: int, output_len: int, offload_gib: float, backend: str) -> tuple[float, object]:
    from runner import LLM, SamplingParams

    llm = LLM(
        model_name,
        load_format="dummy",
        dtype=torch.bfloat16,
        device="cuda",
        max_model_len=512,
        max_num_seqs=batch,
        kv_cache_bytes=8 << 30,
        cpu_offload_gb=offload_gib,
        offload_backend=backend,
    )
    rng = random.Random(0)
    prompts = [[rng.randrange(1000, 100000) for _ in range(32)] for _ in range(batch)]
    params = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)
    llm.generate(prompts[:2], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True), use_tqdm=False)
    torch.cuda.synchronize()
    started = time.perf_counter()
    llm.generate(prompts, params, use_tqdm=False)
    torch.cuda.synchronize()
    rate = batch * output_len / (time.perf_counter() - started)
    offloader = getattr(llm.engine.runner.model, "offloader", None)
    llm.close()
    del llm
    gc.collect()
    torch.cuda.empty_cache()
    return rate, offloader


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.llm.offload_decode", description=__doc__.split("\n")[0])
    p.add_argument("--model", default="llama-3.1-8b-shape")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--out", type=pathlib.Path, default=pathlib.Path("reports"))
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        p.error("needs a CUDA GPU")
    from bench.environment import collect
    from bench.llm.weights_plot import plot_offload
    from runner.model.config import registered

    env = collect()
    config = registered(args.model).config
    h, inter = config.hidden_size, config.intermediate_size
    qkv = (config.num_attention_heads + 2 * config.num_key_value_heads) * config.head_dim
    layer_bytes = 2 * (h * qkv + config.num_attention_heads * config.head_dim * h + 3 * h * inter + 2 * h)
    half = config.num_hidden_layers // 2
    offload_gib = half * layer_bytes / 2**30
    print(f"offload_decode: {args.model}, batch {args.batch}, half the layers = {offload_gib:.2f} GiB", flush=True)
    bandwidth = h2d_bandwidth(layer_bytes)
    print(f"  pinned host -> device: {bandwidth:.1f} GiB/s", flush=True)
    rows = []
    for backend, gib in (("none", 0.0), ("prefetch", offload_gib), ("uva", offload_gib)):
        rate, offloader = decode(args.model, args.batch, args.output_len, gib, "prefetch" if gib == 0 else backend)
        layers = len(offloader.offloaded) if offloader is not None else 0
        moved = layers * layer_bytes / 2**30
        rows.append(
            {
                "offload": backend,
                "batch": args.batch,
                "offloaded_layers": layers,
                "offloaded_gib": moved,
                "tok_per_s": rate,
                "h2d_gib_per_s": bandwidth,
                "step_ms": 1e3 * args.batch / rate,
                "copy_floor_ms": 1e3 * moved / bandwidth,
            }
        )
        print(f"  offload {rows[-1]['offload']}: {layers} layers, {rate:,.0f} output tok/s", flush=True)
    for r in rows:
        r["vs_resident"] = r["tok_per_s"] / rows[0]["tok_per_s"]
    off, uva = rows[1], rows[2]
    command = tables.command_line("python -m bench.llm.offload_decode", argv)
    headline = (
        f"{args.model}, dummy weights, decode batch {args.batch}: prefetch offload of {off['offloaded_layers']} "
        f"layers ({off['offloaded_gib']:.2f} GiB) runs at {off['vs_resident']:.3f}x the resident model's tok/s; "
        f"pinned host->device {bandwidth:.1f} GiB/s in the same run puts a floor of {off['copy_floor_ms']:.0f} ms "
        f"under each offloaded step (measured {off['step_ms']:.0f} ms; resident {rows[0]['step_ms']:.1f} ms). "
        f"uva offload of {uva['offloaded_layers']} layers: {uva['vs_resident']:.3f}x."
    )
    plot = functools.partial(plot_offload, rows=rows)
    folder = tables.write_report(
        args.out, env, "offload_decode", rows, COLUMNS, COLUMNS[:9], headline, {"command": command}, plot=plot
    )
    print(headline)
    print(f"wrote {folder}/offload_decode.csv, .md, .png", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
