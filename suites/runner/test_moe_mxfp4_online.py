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


def test_a_moe_load_holds_one_unquantized_expert_at_a_time(checkpoints):
    """Each expert is quantized as its last matrix arrives: while the checkpoint streams in (safetensors' key order,
    an expert's matrices together), at most one expert's unquantized matrices are held in the whole model, and the
    experts' parameters have no storage (the meta device); a layer's experts all staged at once would be the
    unquantized layer the online load must not hold."""
    from runner.model.llama import LlamaForCausalLM
    from runner.model.moe import SparseMoE
    from runner.model.quant import online_config
    from runner.model.weights import read_hf_config, safetensors_weights

    path, _ = checkpoints
    model = LlamaForCausalLM(read_hf_config(path), torch.float32, "cpu", online_config("mxfp4"))
    layers = [m for m in model.modules() if isinstance(m, SparseMoE)]
    assert len(layers) == 2 and all(m.w13.is_meta and m.w2.is_meta for m in layers)
    most = 0

    def watched():
        nonlocal most
        for item in safetensors_weights(path):
            yield item
            most = max(most, sum(len(m.staged) for m in layers))

    model.load_weights(watched())
    assert most == 1 and all(not m.staged and m.quantized is None for m in layers)
    assert all(m.w13_codes.shape == (4, 128, 32) and not hasattr(m, "w13") for m in layers)


def test_an_expert_left_unloaded_is_named():
    from runner.model.moe import SparseMoE

    moe = SparseMoE(64, 32, 3, 1, True, torch.float32, "cpu", mxfp4=True)
    for e in (0, 2):
        for part, shape in (("w1", (32, 64)), ("w3", (32, 64)), ("w2", (64, 32))):
            moe.weight_loader(moe.w13 if part != "w2" else moe.w2, torch.randn(shape), (e, part))
    moe.weight_loader(moe.w13, torch.randn(32, 64), (1, "w1"))
    with pytest.raises(RuntimeError, match=r"experts \[1\] not \(all\) loaded"):
        moe.process_weights_after_loading()
    with pytest.raises(ValueError, match="expert 0 w2 given twice"):
        moe.weight_loader(moe.w2, torch.randn(64, 32), (0, "w2"))


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
