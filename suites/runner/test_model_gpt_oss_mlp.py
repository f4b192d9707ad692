"""gpt-oss's MoE MLP in the runner (runner.model.gpt_oss_moe.GptOssMoE) against transformers' own GptOssMLP
(modeling_gpt_oss.py, the eager experts loop): a tiny GptOssConfig (hidden 64, intermediate 48, 8 experts,
top 2 and 4) with random weights, its state_dict loaded into GptOssMoE by name; outputs equal within fp32
evaluation-order error on 0, 1, 7 and 33 tokens, fp32 on the CPU (`reference.moe.experts.fused_moe_mirror`).

The draw makes every convention visible: gate/up weights scaled so that some routed gate pre-activations pass the
clamp limit 7 (asserted), a router bias as large as the logits' spread (so dropping it changes the experts
chosen), and non-zero expert biases. Negative controls: gate and up swapped, the [gate | up] halves layout of
Mixtral read instead of the interleave, the router bias dropped: each must fail the same comparison.
Online MXFP4 (`mxfp4=True`): against GptOssMLP with the expert matrices replaced by their MXFP4-decoded values
(the reference quantizer, I zero-padded to the block), as suites/runner/test_moe_mxfp4_online.py does for Mixtral.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from reference.quant.mxfp4 import MX_BLOCK_SIZE, dequantize_mxfp4, quantize_mxfp4
from runner.model.gpt_oss_moe import GptOssMoE
from runner.model.quant.mxfp4 import SCALE_MODE

transformers = pytest.importorskip("transformers")

HIDDEN, INTER, EXPERTS = 64, 48, 8
TOKENS = (0, 1, 7, 33)
# Standard deviation of each parameter's draw (x ~ N(0, 1)): gate/up pre-activations then have sd
# 0.35 * sqrt(64) = 2.8, so a few percent of them pass 7 and the clamps act; the router's logits have sd 0.8
# and its bias sd 1, so the bias decides many of the top-k choices.
STD = {
    "router.weight": 0.1,
    "router.bias": 1.0,
    "experts.gate_up_proj": 0.35,
    "experts.gate_up_proj_bias": 0.5,
    "experts.down_proj": 0.2,
    "experts.down_proj_bias": 0.5,
}
# fp32, the same math in another evaluation order (BLAS sums of 64 and 48 products, the combine's order): worst
# max |diff| 6.2e-7 of max(|out|, 1) over 20 weight/input seeds x top 2 and 4 (~5 fp32 ulps of the peak), MXFP4
# against its fake-quantized oracle the same; 2e-6 is ~3x that. The negative controls below give >= 0.36.
MAX_REL = 2e-6


def _assert_agree(got: torch.Tensor, want: torch.Tensor) -> None:
    scale = max(float(want.abs().max()) if want.numel() else 0.0, 1.0)
    torch.testing.assert_close(got, want, rtol=0.0, atol=MAX_REL * scale)


def _hf_mlp(top_k: int, seed: int = 0):
    from transformers import GptOssConfig
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssMLP

    config = GptOssConfig(
        hidden_size=HIDDEN, intermediate_size=INTER, num_local_experts=EXPERTS, num_experts_per_tok=top_k,
        experts_implementation="eager",
    )  # fmt: skip
    mlp = GptOssMLP(config).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in mlp.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * STD[name])
    return mlp


def _inputs(seed: int = 1) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(t, HIDDEN, generator=g) for t in TOKENS]


@torch.no_grad()
def _hf(mlp, x: torch.Tensor) -> torch.Tensor:
    return mlp(x[None])[0][0]  # GptOssMLP takes [batch, seq, hidden] and returns (out, router scores)


def _loaded(mlp, top_k: int, mxfp4: bool = False) -> GptOssMoE:
    moe = GptOssMoE(HIDDEN, INTER, EXPERTS, top_k, torch.float32, "cpu", mxfp4=mxfp4)
    moe.load_weights(mlp.state_dict().items())
    return moe


@pytest.fixture(scope="module", params=[2, 4], ids=["top2", "top4"])
def hf(request):
    return request.param, _hf_mlp(request.param)


def test_outputs_equal_transformers(hf):
    top_k, mlp = hf
    moe = _loaded(mlp, top_k)
    for x in _inputs():
        got = moe(x)
        assert got.shape == x.shape
        _assert_agree(got, _hf(mlp, x))


def test_the_draw_reaches_the_clamp(hf):
    """Some routed gate pre-activations pass the limit 7 (the gate is clamped above, up on both sides): the
    comparison above covers the clamped SwiGLU, not only its smooth part."""
    _, mlp = hf
    x = torch.cat(_inputs())
    with torch.no_grad():
        _, _, ids = mlp.router(x)
        e = mlp.experts
        gate_up = torch.einsum("th,tkhn->tkn", x, e.gate_up_proj[ids]) + e.gate_up_proj_bias[ids]
    gate, up = gate_up[..., ::2], gate_up[..., 1::2]
    assert int((gate > 7).sum()) > 0 and int((up.abs() > 7).sum()) > 0
    assert float((gate > 7).float().mean()) < 0.2  # and the layer is not all clamp


def _swap_gate_up(moe: GptOssMoE) -> None:
    e = moe.experts
    for p in (e.gate_up_proj, e.gate_up_proj_bias):
        p.data = p.data.unflatten(1, (INTER, 2)).flip(2).flatten(1, 2).contiguous()


def _halves_not_interleaved(moe: GptOssMoE) -> None:
    """The checkpoint's columns read as [gate | up] halves (Mixtral's layout) and interleaved for the kernel."""
    e = moe.experts
    for p in (e.gate_up_proj, e.gate_up_proj_bias):
        p.data = p.data.unflatten(1, (2, INTER)).transpose(1, 2).flatten(1, 2).contiguous()


def _drop_router_bias(moe: GptOssMoE) -> None:
    moe.router.bias.data.zero_()


@pytest.mark.parametrize("fault", [_swap_gate_up, _halves_not_interleaved, _drop_router_bias])
def test_negative_control_a_wrong_convention_is_caught(hf, fault):
    top_k, mlp = hf
    moe = _loaded(mlp, top_k)
    fault(moe)
    x = _inputs()[-1]
    with pytest.raises(AssertionError):
        _assert_agree(moe(x), _hf(mlp, x))


def test_a_misshaped_tensor_is_named():
    mlp = _hf_mlp(2)
    moe = GptOssMoE(HIDDEN, INTER, EXPERTS, 2, torch.float32, "cpu")
    weights = dict(mlp.state_dict())
    weights["experts.gate_up_proj"] = weights["experts.gate_up_proj"].transpose(1, 2)  # already NT
    with pytest.raises(ValueError, match=r"^experts\.gate_up_proj: checkpoint tensor must be \[8, 64, 96\]"):
        moe.load_weights(weights.items())
    with pytest.raises(ValueError, match=r"'router\.bias\.x' has no parameter"):
        moe.load_weights([("router.bias.x", torch.zeros(EXPERTS))])
    with pytest.raises(ValueError, match=r"top_k: must be in \[1, 8\]"):
        GptOssMoE(HIDDEN, INTER, EXPERTS, 9, torch.float32, "cpu")


def _fake_quantized(w: torch.Tensor) -> torch.Tensor:
    """w [N, K] through MXFP4 and back (K zero-padded to the block), as the online load quantizes it."""
    k = w.shape[1]
    codes, scales = quantize_mxfp4(F.pad(w, (0, -k % MX_BLOCK_SIZE)).contiguous(), scale_mode=SCALE_MODE)
    return dequantize_mxfp4(codes, scales, dtype=torch.float32)[:, :k]


@pytest.fixture(scope="module")
def fake_mxfp4(hf):
    """GptOssMLP with its expert matrices fake-quantized along their K (transformers holds them as x @ W, K
    first: each expert's W^T is quantized, the kernel's layout)."""
    top_k, mlp = hf
    fake = _hf_mlp(top_k)
    with torch.no_grad():
        for name in ("gate_up_proj", "down_proj"):
            w = getattr(fake.experts, name)
            w.copy_(torch.stack([_fake_quantized(we.T).T for we in w]))
    return top_k, mlp, fake


def test_online_mxfp4_equals_the_fake_quantized_model(fake_mxfp4):
    top_k, mlp, fake = fake_mxfp4
    moe = _loaded(mlp, top_k, mxfp4=True)
    assert moe.w13_codes.shape == (EXPERTS, 128, 32) and moe.w2_scales.shape == (EXPERTS, 64, 2)  # I 48 -> 64
    assert moe.experts.gate_up_proj_bias.shape == (EXPERTS, 128)
    assert not hasattr(moe.experts, "gate_up_proj")  # the unquantized matrices were dropped
    for x in _inputs():
        _assert_agree(moe(x), _hf(fake, x))
    with pytest.raises(AssertionError):  # the quantization is real: the unquantized model is another output
        _assert_agree(moe(x), _hf(mlp, x))


def test_negative_control_mxfp4_padding_in_halves_is_caught(fake_mxfp4, monkeypatch):
    """Padding the interleaved rows as [gate | up] halves (SparseMoE's layout) pairs gates with the wrong ups."""
    import runner.model.gpt_oss_moe as module
    from runner.model import moe as shared

    def in_halves(w13, w2, interleaved, w13_bias=None):
        return shared.quantize_experts(w13, w2, False, w13_bias)

    monkeypatch.setattr(module, "quantize_experts", in_halves)
    top_k, mlp, fake = fake_mxfp4
    moe = _loaded(mlp, top_k, mxfp4=True)
    x = _inputs()[-1]
    with pytest.raises(AssertionError):
        _assert_agree(moe(x), _hf(fake, x))
