"""Block-FP8 layers fed by producers that quantize their own output (runner.model.quant.activation): RMSNorm
before qkv_proj and gate_up_proj, SiLU-and-mul before down_proj hand over Fp8Groups instead of bf16, and the
model must compute exactly what it computes when each GEMM quantizes its input itself (the fused kernels write
the separate quantizer's bytes over their unfused output). Where the seam applies and where it must not."""

from __future__ import annotations

import pytest
import torch

from kernels.tolerances import assert_exact
from runner.model import llama
from runner.model.layers import Linear
from runner.model.quant import make_scheme, online_config
from runner.model.quant.activation import Fp8Groups, wants_fp8_groups
from runner.model.weights import dummy_weights
from suites.runner.model_driver import greedy
from suites.runner.tiny_llama import ALIGNED_128, SMALL_GPU

PROMPTS = [[5, 17, 33, 2, 9, 41], [60, 3, 3, 71]]


def _force_kernels(monkeypatch) -> None:
    """Every kernel branch on CPU tensors (the Triton interpreter runs them on this tier)."""
    from runner.model import layers
    from runner.model.quant import fp8_block, scheme

    for module in (layers, scheme, fp8_block):
        monkeypatch.setattr(module, "uses_kernels", lambda x: True)


def test_block_fp8_mlp_with_quantized_inputs_equals_its_unfused_form(monkeypatch, device):
    """A block-FP8 LlamaMLP: gate_up_proj takes the caller's Fp8Groups (as the decoder layer's RMSNorm makes
    them) and down_proj SiLU-and-mul's; the output equals the MLP that takes bf16 and quantizes in each GEMM."""
    from runner.model.layers import RMSNorm

    config = ALIGNED_128
    mlp = llama.LlamaMLP(config, torch.bfloat16, device, online_config("fp8_block"), "model.layers.0.mlp")
    g = torch.Generator().manual_seed(3)
    for shard in (0, 1):
        w = torch.randn(config.intermediate_size, config.hidden_size, generator=g) / 16
        mlp.gate_up_proj.weight_loader(mlp.gate_up_proj.weight, w.bfloat16().to(device), shard)
    w = torch.randn(config.hidden_size, config.intermediate_size, generator=g) / 16
    mlp.down_proj.weight_loader(mlp.down_proj.weight, w.bfloat16().to(device))
    h, residual = (torch.randn(3, config.hidden_size, generator=g).bfloat16().to(device) for _ in range(2))
    norm = RMSNorm(config.hidden_size, 1e-5, torch.bfloat16, device)
    with torch.no_grad():
        norm.weight.copy_((1 + torch.randn(config.hidden_size, generator=g) / 4).bfloat16())
    if device == "cpu":
        _force_kernels(monkeypatch)
    groups, new_residual = norm(h, residual, fp8_groups=True)
    assert isinstance(groups, Fp8Groups) and groups.codes.dtype == torch.float8_e4m3fn
    fused = mlp(groups)
    monkeypatch.setattr(llama, "wants_fp8_groups", lambda *args: False)
    normed, plain_residual = norm(h, residual)
    plain = mlp(normed)
    assert_exact(fused.cpu(), plain.cpu(), "MLP output")
    assert_exact(new_residual.cpu(), plain_residual.cpu(), "new residual")
    # negative control: groups whose scales belong to the next token give another output
    shifted = Fp8Groups(groups.codes, groups.scales.roll(1, dims=0), torch.bfloat16)
    assert not torch.equal(mlp(shifted).cpu(), plain.cpu())


def test_the_seam_applies_only_where_it_can(monkeypatch):
    """Fp8Groups only for a scheme that takes them, for bf16 on the kernels, and for whole 128-wide groups."""
    from runner.model.quant import scheme

    block = Linear(256, 128, torch.bfloat16, "cpu", make_scheme("fp8_block", online=True))
    plain = Linear(256, 128, torch.bfloat16, "cpu", None)
    x = torch.zeros(2, 256, dtype=torch.bfloat16)
    assert not wants_fp8_groups(block, x, 256)  # CPU: the references run, and they take bf16
    monkeypatch.setattr(scheme, "uses_kernels", lambda x: True)
    assert wants_fp8_groups(block, x, 256)
    assert not wants_fp8_groups(block, x, 200)  # a group would straddle the padding
    assert not wants_fp8_groups(plain, x, 256)
    for name in ("fp8", "mxfp4"):
        other = Linear(256, 128, torch.bfloat16, "cpu", make_scheme(name, online=True))
        assert not wants_fp8_groups(other, x, 256), name


@pytest.mark.gpu_only(reason="the seam exists where the Triton kernels run: CUDA, bf16")
def test_gpu_block_fp8_model_logits_are_those_of_the_unfused_model(monkeypatch, device):
    """The whole decoder on the GPU: every RMSNorm and SiLU-and-mul feeding a block-FP8 GEMM hands over
    Fp8Groups; the greedy logits equal, bit for bit, those of the same model with the seam shut."""
    model = llama.LlamaForCausalLM(SMALL_GPU, torch.bfloat16, device, online_config("fp8_block"))
    model.load_weights(dummy_weights(SMALL_GPU, seed=0, device=device, dtype=torch.bfloat16))
    model.eval()
    calls = []
    real = llama.wants_fp8_groups
    monkeypatch.setattr(llama, "wants_fp8_groups", lambda *a: calls.append(real(*a)) or real(*a))
    tokens, fused = greedy(model, PROMPTS, 4, device=device)
    assert calls and all(calls), "the seam never opened"
    monkeypatch.setattr(llama, "wants_fp8_groups", lambda *args: False)
    plain_tokens, plain = greedy(model, PROMPTS, 4, device=device)
    assert tokens == plain_tokens
    assert_exact(fused.cpu(), plain.cpu(), "logits")
