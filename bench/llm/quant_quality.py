"""Quality of online quantization on the embedded model (CPU): `python -m bench.llm.quant_quality`.

For the unquantized model (fp32 on the CPU), the same model with its decoder weights rounded to bf16 (the
bars' denominator), and each online scheme (`LLM(..., quantization=...)`: fp8, fp8_block, mxfp4, nvfp4), in one
run:
- perplexity on bench/llm/data/prose.txt (public-domain prose, ~7 KB: the openings of the Declaration of
  Independence, A Tale of Two Cities, Moby-Dick, Pride and Prejudice, A Christmas Carol and Frankenstein, a
  paragraph of Walden, the Gettysburg Address and the close of Lincoln's second inaugural), every token scored
  given the ones before it, in one forward; the ratio to the bf16 model with a 95 % interval (a paired bootstrap
  over the scored tokens: how far the figure could move on other text of this kind);
- for fp8 and fp8_block, the perplexity with the scheme's dequantized weights and unquantized activations
  (weights only): what E4M3 weights alone cost;
- top-1 agreement: the unquantized model's greedy continuation of 8 prompts x 64 tokens is fed back (teacher
  forcing) and the scheme's argmax compared with it at each of the 512 positions;
- per-layer SQNR of the dequantized weight against the unquantized one (the layers' table and the PNG);
- for mxfp4 and nvfp4, the perplexity of the torchao-emulated model (weights through torchao's `to_mx` /
  `NVFP4Tensor` and back) beside it: equal bytes give equal perplexities; for fp8's weights only, torchao's
  per-tensor E4M3 weights beside them, and a row with one scale an output channel (torchao's): whether a finer
  scale than the scheme's would buy back what E4M3 weights cost.
Writes reports/cpu-<slug>/quant_quality.{csv,md,png,pytorch.json} and quant_quality_layers.csv."""

from __future__ import annotations

import argparse
import math
import pathlib
import sys

import torch

from bench import tables

PROMPTS = [
    "The history of the printing press",
    "In the morning the harbour was",
    "A good recipe for bread starts with",
    "The theory of evolution explains",
    "Once upon a time, in a small village,",
    "The main causes of the French Revolution were",
    "To compute the area of a circle,",
    "The river flowed slowly past the",
]
SCHEMES = ("fp8", "fp8_block", "mxfp4", "nvfp4")
TEXT = pathlib.Path(__file__).with_name("data") / "prose.txt"
BLOCK_SIZE = 16
COLUMNS = (
    "scheme",
    "perplexity",
    "perplexity_vs_unquantized",
    "perplexity_vs_bf16",
    "vs_bf16_ci95_low",
    "vs_bf16_ci95_high",
    "torchao_emulated_perplexity",
    "torchao_weights_differing",
    "top1_agreement",
    "weight_sqnr_db_median",
    "weight_sqnr_db_min",
    "scored_tokens",
    *tables.RUN_COLUMNS,
)


def all_logits(model, ids: list[list[int]]) -> list[torch.Tensor]:
    """fp32 logits [len, vocab] at every position of each sequence, one forward over a fresh paged cache."""
    from runner.engine.model_runner import allocate_kv
    from runner.model.attention import make_batch

    per = [-(-len(s) // BLOCK_SIZE) for s in ids]
    _, caches = allocate_kv(model.config, 1 + sum(per), BLOCK_SIZE, model.dtype, "cpu")
    starts = [1 + sum(per[:i]) for i in range(len(ids))]
    tables = [list(range(s, s + n)) for s, n in zip(starts, per, strict=True)]
    lens = [len(s) for s in ids]
    batch = make_batch(tables, lens, lens, BLOCK_SIZE, "cpu")
    flat = torch.tensor([t for s in ids for t in s], dtype=torch.int64)
    positions = torch.cat([torch.arange(n) for n in lens])
    logits = model.compute_logits(model(flat, positions, batch, caches))
    return list(logits.split(lens))


def token_nll(model, ids: list[int]) -> torch.Tensor:
    """fp64 negative log-likelihood of each of ids[1:] given the tokens before it."""
    logits = all_logits(model, [ids])[0][:-1]
    return torch.nn.functional.cross_entropy(logits.double(), torch.tensor(ids[1:]), reduction="none")


def perplexity(model, ids: list[int]) -> float:
    return math.exp(float(token_nll(model, ids).mean()))


def ratio_interval(nll: torch.Tensor, base: torch.Tensor, draws: int = 2000) -> tuple[float, float]:
    """95 % interval of the perplexity ratio exp(mean(nll - base)): a paired bootstrap over the scored tokens
    (fixed seed, so a report is reproducible)."""
    delta = nll - base
    generator = torch.Generator().manual_seed(0)
    picks = torch.randint(0, len(delta), (draws, len(delta)), generator=generator)
    ratios = delta[picks].mean(1).exp().sort().values
    return float(ratios[int(0.025 * draws)]), float(ratios[int(0.975 * draws) - 1])


def with_weights(base, weights):
    """A copy of `base` whose linear layers named in `weights` (name -> [out, in]) take those weights."""
    import copy

    from runner.model.layers import Linear

    model = copy.deepcopy(base)
    for name, layer in model.named_modules():
        if isinstance(layer, Linear) and name in weights:
            layer.weight.data.copy_(weights[name])
    return model


def dequantized_weights(quantized):
    """(layer name, scheme, its dequantized weight [out, in] in float64) of each online-quantized layer."""
    from runner.model.layers import Linear
    from runner.model.quant.dequantized import dequantized_weight

    for name, layer in quantized.named_modules():
        if isinstance(layer, Linear) and layer.scheme.online:
            yield name, layer.scheme.name, dequantized_weight(layer, torch.float64)


def layer_sqnr(reference, quantized) -> list[dict]:
    """SQNR (dB) of each quantized linear layer's dequantized weight against the unquantized weight."""
    from runner.model.layers import Linear

    ref = {n: m for n, m in reference.named_modules() if isinstance(m, Linear)}
    rows = []
    for name, scheme, deq in dequantized_weights(quantized):
        w = ref[name].weight.detach().double()
        sqnr = 10 * math.log10(float(w.pow(2).sum() / (deq - w).pow(2).sum()))
        rows.append({"scheme": scheme, "layer": name, "sqnr_db": sqnr})
    return rows


def differing_fraction(quantized, emulated) -> float:
    """Fraction of decoder linear weights whose dequantized value differs between the runner and torchao, at the
    precision both models run them in (the emulated model's weight dtype)."""
    from runner.model.layers import Linear

    theirs = {n: m for n, m in emulated.named_modules() if isinstance(m, Linear)}
    differ = total = 0
    for name, _, deq in dequantized_weights(quantized):
        w = theirs[name].weight.detach()
        differ += int((deq.to(w.dtype) != w).sum())
        total += w.numel()
    return differ / total


def decoder_weights(base, through):
    """{name: through(weight)} for every decoder linear layer of `base` (the ones online schemes quantize)."""
    from runner.model.layers import Linear

    return {
        name: through(layer.weight.data)
        for name, layer in base.named_modules()
        if isinstance(layer, Linear) and ".layers." in name
    }


def torchao_emulated(base, scheme: str):
    """A copy of the unquantized model with every decoder linear weight through torchao's quantizer and back:
    `to_mx` (scale mode floor) for mxfp4, `NVFP4Tensor.to_nvfp4` with the tensor's own global scale for
    nvfp4 (the MX emulators' fake-quantized model), its float8 primitives with one E4M3 scale a tensor ("fp8") or
    an output channel ("fp8 per channel")."""
    return with_weights(base, decoder_weights(base, lambda w: _torchao_roundtrip(w, scheme)))


def _torchao_roundtrip(w: torch.Tensor, scheme: str) -> torch.Tensor:
    if scheme in ("fp8", "fp8 per channel"):
        from torchao.quantization.quant_primitives import _choose_scale_float8, _quantize_affine_float8

        block = list(w.shape) if scheme == "fp8" else [1, w.shape[1]]
        scale = _choose_scale_float8(w, block_size=block, float8_dtype=torch.float8_e4m3fn)
        codes = _quantize_affine_float8(w, scale, torch.float8_e4m3fn)
        return codes.double() * scale.double()  # exact, as the runner's dequantized weights are compared
    if scheme == "mxfp4":
        from torchao.prototype.mx_formats.config import ScaleCalculationMode
        from torchao.prototype.mx_formats.mx_tensor import to_dtype, to_mx

        fp4 = torch.float4_e2m1fn_x2
        scales, codes = to_mx(w, fp4, 32, ScaleCalculationMode.FLOOR)
        return to_dtype(codes, scales, fp4, 32, torch.float32)
    from torchao.prototype.mx_formats.nvfp4_tensor import NVFP4Tensor, per_tensor_amax_to_scale

    t = NVFP4Tensor.to_nvfp4(w, per_tensor_scale=per_tensor_amax_to_scale(w.abs().max()))
    return t.dequantize(torch.float32)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.llm.quant_quality", description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--out", type=pathlib.Path, default=pathlib.Path("reports"))
    p.add_argument("--smoke", action="store_true", help="2 prompts x 8 tokens and the first 64 text tokens (tests)")
    p.add_argument("--schemes", default=",".join(SCHEMES), help=f"comma-separated, of {', '.join(SCHEMES)}")
    args = p.parse_args(argv)
    schemes = args.schemes.split(",")
    if unknown := set(schemes) - set(SCHEMES):
        p.error(f"--schemes: unknown {sorted(unknown)}; known {', '.join(SCHEMES)}")

    from bench.environment import collect
    from bench.llm.quant_plot import plot
    from runner import LLM, SamplingParams
    from runner.model import gguf_path, load_model
    from runner.model.gguf_file import GGUFCheckpoint
    from runner.model.llama import LlamaForCausalLM
    from runner.model.quant import online_config

    torch.manual_seed(0)
    env = collect()
    print(f"quant_quality: {args.model} on the CPU; schemes {', '.join(schemes)}", flush=True)
    base, tok, config = load_model(args.model, dtype=torch.float32, device="cpu")
    # The checkpoint's tensors, read once for every scheme (a GGUF read takes ~5 s of metadata parsing)
    tensors = list(GGUFCheckpoint(gguf_path(args.model)).weights())
    text_ids = tok.encode(TEXT.read_text())
    prompts = PROMPTS
    if args.smoke:
        text_ids, prompts, args.new_tokens = text_ids[:64], PROMPTS[:2], 8
    llm = LLM(loaded=(base, tok, config), device="cpu", dtype="float32", max_model_len=512, enforce_eager=True)
    prompt_ids = [tok.encode(p) for p in prompts]
    greedy = SamplingParams(temperature=0, max_tokens=args.new_tokens, ignore_eos=True)
    outs = llm.generate(prompt_ids, greedy, use_tqdm=False)
    sequences = [p + list(o.token_ids) for p, o in zip(prompt_ids, outs, strict=True)]
    base_nll = token_nll(base, text_ids)
    bf16_nll = token_nll(with_weights(base, decoder_weights(base, lambda w: w.bfloat16().to(w.dtype))), text_ids)
    base_ppl, bf16_ppl = (math.exp(float(nll.mean())) for nll in (base_nll, bf16_nll))

    def scored(name: str, nll: torch.Tensor, **extra) -> dict:
        ppl = math.exp(float(nll.mean()))
        low, high = ratio_interval(nll, bf16_nll)
        print(f"  {name}: perplexity {ppl:.3f} ({ppl / bf16_ppl:.4f}x bf16, 95 % {low:.4f}-{high:.4f})", flush=True)
        return {
            "scheme": name,
            "perplexity": ppl,
            "perplexity_vs_unquantized": ppl / base_ppl,
            "perplexity_vs_bf16": ppl / bf16_ppl,
            "vs_bf16_ci95_low": low,
            "vs_bf16_ci95_high": high,
            **extra,
        }

    print(f"  scoring {len(text_ids) - 1} tokens", flush=True)
    rows = [scored("unquantized (fp32)", base_nll), scored("bf16 weights", bf16_nll)]
    layers: list[dict] = []
    for scheme in schemes:
        model = LlamaForCausalLM(config, torch.float32, "cpu", online_config(scheme))
        model.load_weights(iter(tensors))
        model.eval()
        agree = total = 0
        for seq, logits in zip(sequences, all_logits(model, sequences), strict=True):
            first = len(seq) - args.new_tokens  # logits[i] predicts token i + 1
            pred = logits[first - 1 : len(seq) - 1].argmax(-1)
            agree += int((pred == torch.tensor(seq[first:])).sum())
            total += args.new_tokens
        per_layer = layer_sqnr(base, model)
        layers += per_layer
        sqnrs = sorted(r["sqnr_db"] for r in per_layer)
        extra = {}
        if scheme in ("mxfp4", "nvfp4"):
            emulated = torchao_emulated(base, scheme)
            extra["torchao_emulated_perplexity"] = perplexity(emulated, text_ids)
            extra["torchao_weights_differing"] = differing_fraction(model, emulated)
        sqnr = {"weight_sqnr_db_median": sqnrs[len(sqnrs) // 2], "weight_sqnr_db_min": sqnrs[0]}
        rows.append(scored(scheme, token_nll(model, text_ids), top1_agreement=agree / total, **sqnr, **extra))
        if scheme in ("fp8", "fp8_block"):
            weights = {name: deq for name, _, deq in dequantized_weights(model)}
            only = scored(f"{scheme} weights only", token_nll(with_weights(base, weights), text_ids), **sqnr)
            rows.append(only)
            if scheme == "fp8":  # torchao's per-tensor E4M3 weights beside the runner's, then a finer scale
                emulated = torchao_emulated(base, scheme)
                only["torchao_emulated_perplexity"] = perplexity(emulated, text_ids)
                only["torchao_weights_differing"] = differing_fraction(model, emulated)
                channel = torchao_emulated(base, "fp8 per channel")
                rows.append(scored("fp8 weights only, per channel (torchao)", token_nll(channel, text_ids)))
        del model
    for row in rows:
        row["scored_tokens"] = len(text_ids) - 1
    command = tables.command_line("python -m bench.llm.quant_quality", argv)
    fp8 = [r for r in rows if r["scheme"] in ("fp8", "fp8_block")]
    worst = max(fp8, key=lambda r: r["perplexity_vs_bf16"], default=None)
    headline = (
        f"{args.model} on the CPU, {len(text_ids) - 1} tokens of bench/llm/data/prose.txt: perplexity of fp8 and "
        + (
            f"fp8_block at most {worst['perplexity_vs_bf16']:.4f}x the bf16 model's ({worst['scheme']}; 95 % "
            f"interval {worst['vs_bf16_ci95_low']:.3f}-{worst['vs_bf16_ci95_high']:.3f}); "
            if worst
            else "fp8_block not run; "
        )
        + f"top-1 agreement over {len(prompts)} prompts x {args.new_tokens} tokens of the unquantized model's greedy "
        "continuation."
    )
    folder = tables.write_report(
        args.out,
        env,
        "quant_quality",
        rows,
        COLUMNS,
        COLUMNS[:10],
        headline,
        {"command": command},
        intro=[
            "The bf16 model is the unquantized one with its decoder weights rounded to bf16 (activations fp32): the "
            "denominator of the ratios and of the 95 % intervals (paired bootstrap over the scored tokens).",
            "fp8 and fp8_block quantize activations to E4M3 too (per token; per 1 x 128 group); their 'weights only' "
            "rows run the same dequantized weights with fp32 activations. mxfp4 and nvfp4 run weight-only (W4A16); "
            "beside them, the torchao-emulated model's perplexity (for fp8's weights only, torchao's per-tensor E4M3 "
            "weights). The per-channel row is torchao's E4M3 with one scale an output channel, weights only.",
            "fp8's differing weights are exact ties of w / scale, torchao's quotient, which the runner's "
            "w * (1 / scale) (vLLM's and the CUDA kernels' order) rounds to the neighbouring code.",
            "nvfp4's differing weights are blocks whose exact E4M3 scale is a tie (common for bf16-valued weights), "
            "which two fp32 orders round to neighbouring codes: the runner's amax * (s_enc / 6) (vLLM's and "
            "flashinfer's order, reference.quant.nvfp4) and torchao's (amax / 6) / s_dec. In layer 0's down_proj, "
            "224 blocks, e.g. amax 0.5390625 under a tensor amax of 2.875: 84.0000076 -> 88 against exactly 84 -> 80 "
            "(ties to even).",
        ],
    )
    import pandas as pd

    tables.write(folder / "quant_quality_layers.csv", pd.DataFrame(layers))
    plot(folder / "quant_quality.png", layers, rows)
    print(f"wrote {folder}/quant_quality.csv, .md, .png, quant_quality_layers.csv", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
