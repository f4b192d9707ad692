"""Online MXFP4 experts (`quantization="mxfp4"`) for a MoE model: a tiny Mixtral whose intermediate size (48) is
no multiple of the 32-wide MX block, so the loading chain pads it with zeros, quantizes, and runs the experts
from codes and scales (`reference.moe.quantized.mxfp4_moe_mirror` on the CPU). Oracle: the same checkpoint with
every matrix the online config quantizes (attention projections, experts) replaced by its MXFP4-decoded values
(the reference quantizer, the same zero padding), loaded unquantized: greedy tokens equal, logits within the
runner's evaluation-order row (zero padding adds exact zeros to the second GEMM's sums). Also: other online
schemes refuse MoE experts by name, and a hidden size the MX block does not divide is refused."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from kernels.tolerances import assert_agree, families, sqnr_db
from reference.quant.mxfp4 import MX_BLOCK_SIZE, dequantize_mxfp4, quantize_mxfp4
from runner.model import load_model
from runner.model.quant.mxfp4 import SCALE_MODE
from suites.runner.hf_moe import NEW_TOKENS, PROMPTS, save_tiny
from suites.runner.model_driver import greedy

transformers = pytest.importorskip("transformers")
QUANTIZED = (".self_attn.q_proj.", ".self_attn.k_proj.", ".self_attn.v_proj.", ".self_attn.o_proj.", ".experts.")


def _fake_quantized(w: torch.Tensor) -> torch.Tensor:
    """w [N, K] through MXFP4 and back (K zero-padded to the block), as the online load quantizes it."""
    k = w.shape[1]
    codes, scales = quantize_mxfp4(F.pad(w, (0, -k % MX_BLOCK_SIZE)), scale_mode=SCALE_MODE)
    return dequantize_mxfp4(codes, scales, dtype=torch.float32)[:, :k].contiguous()


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    from safetensors.torch import load_file, save_file
    from transformers import MixtralConfig, MixtralForCausalLM

    config = MixtralConfig(
        vocab_size=96, hidden_size=64, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=128,
        rms_norm_eps=1e-5, tie_word_embeddings=False,
    )  # fmt: skip
    path, _ = save_tiny(MixtralForCausalLM, config, tmp_path_factory.mktemp("mixtral"))
    fake = tmp_path_factory.mktemp("mixtral_fake_mxfp4")
    tensors = load_file(str(path / "model.safetensors"))
    save_file(
        {n: _fake_quantized(t) if any(q in n for q in QUANTIZED) else t for n, t in tensors.items()},
        str(fake / "model.safetensors"),
    )
    (fake / "config.json").write_text((path / "config.json").read_text())
    return path, fake


def _logits(path, **kwargs):
    model, _, _ = load_model(str(path), dtype=torch.float32, device="cpu", tokenizer=False, **kwargs)
    return model, greedy(model, PROMPTS, NEW_TOKENS)


def test_online_mxfp4_experts_equal_the_fake_quantized_model(checkpoints):
    path, fake = checkpoints
    model, (tokens, logits) = _logits(path, quantization="mxfp4")
    moe = model.model.layers[0].block_sparse_moe
    assert moe.w13_codes.shape == (4, 128, 32) and moe.w2_scales.shape == (4, 64, 2)  # I 48 padded to 64
    assert not hasattr(moe, "w13")  # the unquantized experts were dropped
    _, (want_tokens, want_logits) = _logits(fake)
    assert tokens == want_tokens
    for got, want in zip(logits, want_logits, strict=True):
        assert_agree(families.LLAMA_ORDERS, got, want, "first-step logits")


def test_negative_control_unquantized_experts_are_caught(checkpoints, tmp_path):
    """The oracle sees the experts: with only the attention projections fake-quantized, the logits disagree."""
    from safetensors.torch import load_file, save_file

    path, fake = checkpoints
    tensors = load_file(str(fake / "model.safetensors"))
    plain = load_file(str(path / "model.safetensors"))
    save_file({n: plain[n] if ".experts." in n else t for n, t in tensors.items()}, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text((path / "config.json").read_text())
    _, (_, logits) = _logits(path, quantization="mxfp4")
    _, (_, attention_only) = _logits(tmp_path)
    with pytest.raises(AssertionError):
        for got, want in zip(logits, attention_only, strict=True):
            assert_agree(families.LLAMA_ORDERS, got, want, "first-step logits")


def test_the_quantization_is_real(checkpoints):
    """The MXFP4 model's first-step logits differ from the unquantized model's by MXFP4's loss, not by nothing
    and not by a broken model: 6.1, 10.7 and 9.8 dB over the three prompts (two layers of unit-scale random
    weights, each MXFP4 matrix ~14 dB on its own: suites/moe/test_quantized.py); a model whose quantized experts
    were wrong gives ~0 dB or less."""
    path, _ = checkpoints
    _, (_, quantized) = _logits(path, quantization="mxfp4")
    _, (_, plain) = _logits(path)
    for got, want in zip(quantized, plain, strict=True):
        assert 3.0 < sqnr_db(got, want) < 40.0


def test_other_online_schemes_refuse_moe_experts(checkpoints):
    path, _ = checkpoints
    with pytest.raises(ValueError, match="quantization: fp8 MoE experts are not implemented"):
        load_model(str(path), dtype=torch.float32, device="cpu", tokenizer=False, quantization="fp8")


def test_a_hidden_size_off_the_mx_block_is_refused(tmp_path):
    from runner.model.config import LlamaConfig
    from runner.model.moe import SparseMoE

    config = LlamaConfig.from_hf(
        json.loads(
            json.dumps(
                dict(model_type="mixtral", vocab_size=32, hidden_size=48, intermediate_size=32, num_hidden_layers=1,
                     num_attention_heads=2, num_key_value_heads=2, num_local_experts=2, num_experts_per_tok=1)
            )
        )
    )  # fmt: skip
    with pytest.raises(ValueError, match="hidden_size a multiple of 32, got 48"):
        SparseMoE(config.hidden_size, 32, 2, 1, True, torch.float32, "cpu", mxfp4=True)
