"""MoE checkpoints made by llm-compressor itself, loaded by the runner. A tiny transformers Qwen3-MoE goes through
`oneshot` with a preset on the experts alone (attention, routers and head ignored; on the CPU, no calibration
data), which takes transformers 5's fused experts apart into one Linear per expert matrix, and saves the
checkpoint compressed:
- MXFP4A16: per expert matrix `weight_packed` (uint8 E2M1 pairs [N, K / 2]) and `weight_scale` (E8M0 [N, K / 32]),
  the bytes the runner's MXFP4 experts hold;
- FP8_BLOCK: `weight` (E4M3) and `weight_scale` (fp32 per 128 x 128 tile), the runner's block-FP8 experts, whose
  activations are quantized per token and 128-wide group at run time.

The oracle is the producer's fake-quantized model, the one `oneshot` leaves in memory, run in transformers:
- every expert matrix the runner holds, decoded, is the producer's fake-quantized weight, bit for bit (up to the
  sign of zero: the runner stores MXFP4 -0 codes as +0);
- greedy decoding (`producers.check_greedy`): MXFP4A16 quantizes no activation, so tokens equal and logits within
  fp32 order; FP8_BLOCK's may differ from a step whose two best logits are within one flipped E4M3 activation
  code's reach.
Negative control: the runner's gate and up halves of every expert swapped fail the weight check."""

from __future__ import annotations

import pytest
import torch

from kernels.tolerances import assert_exact
from reference.quant.fp8 import dequantize_fp8_blocks
from reference.quant.mxfp4 import dequantize_mxfp4
from runner.model import load_model
from suites.runner.conftest import one_thread
from suites.runner.hf_moe import save_tiny
from suites.runner.producers import FLIP_BOUND, check_greedy, fake_quantized_weight

EXPERTS = 4
SCHEMES = {"MXFP4A16": "mxfp4", "FP8_BLOCK": "fp8_block"}
BOUNDS = {"MXFP4A16": 1e-5, "FP8_BLOCK": FLIP_BOUND}


@pytest.fixture(scope="module", params=list(SCHEMES))
def produced(request, tmp_path_factory):
    """(preset, the producer's fake-quantized transformers model, the runner's model of its saved checkpoint)."""
    pytest.importorskip("llmcompressor")
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    preset, folder = request.param, tmp_path_factory.mktemp("llmcompressor_moe")
    config = Qwen3MoeConfig(
        vocab_size=96, hidden_size=128, intermediate_size=256, moe_intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, num_experts=EXPERTS, num_experts_per_tok=2,
        norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], max_position_embeddings=128,
        tie_word_embeddings=False, eos_token_id=None,  # transformers' generate runs all the steps
    )  # fmt: skip
    base = save_tiny(Qwen3MoeForCausalLM, config, folder / "base")[0]
    ignore = ["lm_head", "re:.*self_attn.*", "re:.*mlp.gate$"]
    with one_thread():
        # Twice: saving compresses the model in place; the oracle is a second run of the same data-free recipe
        models = []
        for _ in range(2):
            model = Qwen3MoeForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
            oneshot(model=model, recipe=QuantizationModifier(targets="Linear", scheme=preset, ignore=ignore))
            models.append(model)
        models[1].save_pretrained(folder / preset, save_compressed=True)
        ours = load_model(str(folder / preset), dtype=torch.float32, device="cpu", tokenizer=False)[0]
    return preset, models[0], ours


def _producer_experts(theirs, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The producer's fake-quantized (w13 [E, 2I, H]: gate rows then up rows, w2 [E, H, I]) of one layer."""
    experts = theirs.model.layers[layer].mlp.experts
    fake = fake_quantized_weight
    w13 = torch.stack([torch.cat([fake(experts[e].gate_proj), fake(experts[e].up_proj)]) for e in range(EXPERTS)])
    return w13, torch.stack([fake(experts[e].down_proj) for e in range(EXPERTS)])


def _runner_experts(ours, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The runner's experts of one layer, decoded (fp32)."""
    moe = ours.model.layers[layer].mlp
    if moe.checkpoint == "mxfp4":
        return tuple(
            dequantize_mxfp4(getattr(moe, f"{w}_codes"), getattr(moe, f"{w}_scales"), dtype=torch.float32)
            for w in ("w13", "w2")
        )
    w13_scales, w2_scales = (getattr(moe, name) for name in moe.scale_params)
    return tuple(
        torch.stack([dequantize_fp8_blocks(c, s) for c, s in zip(codes, scales, strict=True)]).float()
        for codes, scales in ((moe.w13, w13_scales), (moe.w2, w2_scales))
    )


def test_the_experts_take_the_presets_scheme_and_the_rest_stays_unquantized(produced):
    preset, _, ours = produced
    for layer in ours.model.layers:
        assert layer.mlp.checkpoint == SCHEMES[preset]
        assert layer.self_attn.qkv_proj.scheme.name == "unquantized"


@pytest.mark.parametrize("layer", [0, 1])
def test_expert_weights_are_the_producers_fake_quantized_weights(produced, layer):
    _, theirs, ours = produced
    for got, want in zip(_runner_experts(ours, layer), _producer_experts(theirs, layer), strict=True):
        assert_exact(got + 0.0, want + 0.0, "expert weights")  # x + 0.0: -0 reads as +0


def test_negative_control_gate_and_up_swapped_are_caught(produced):
    _, theirs, ours = produced
    w13, _ = _runner_experts(ours, 0)
    half = w13.shape[1] // 2
    swapped = torch.cat([w13[:, half:], w13[:, :half]], dim=1)
    with pytest.raises(AssertionError):
        assert_exact(swapped + 0.0, _producer_experts(theirs, 0)[0] + 0.0, "expert weights")


def test_greedy_decoding_follows_the_producer(produced):
    preset, theirs, ours = produced
    check_greedy(theirs, ours, BOUNDS[preset])
