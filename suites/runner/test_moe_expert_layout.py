"""Where the packed PTX runs (NVIDIA sm_90+), the runner stores online-MXFP4 experts in the fragment layout
(`runner.model.moe.store_experts`) and runs them as `kernels.mxfp4_moe_fragment`: a SparseMoE layer on CUDA in
bf16 holds words and scale pairs, and its forward at decode (the tensor-core GEMVs) and at prefill (the bf16 layer
on the decoded experts) is within the "mxfp4_moe" row of the mirror on the same quantized experts. Elsewhere the
layer keeps codes and scales (suites/runner/test_moe_mxfp4_online.py). Every tier: the per-expert preparation
equals the stack's."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernels import mxfp4_fragment_layout as layout
from kernels._packed_ptx import packed_ptx
from kernels.tolerances import assert_lossy, families
from reference.moe.quantized import mxfp4_moe_ideal, mxfp4_moe_mirror
from reference.moe.routing import softmax_topk
from runner.model.moe import SparseMoE, prepare_experts, quantize_experts


def test_prepare_experts_equals_the_stack_prepared_at_once():
    """The runner prepares an expert at a time into one stack (every tier): the same words and pairs as
    `prepare` of the whole stack."""
    g = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 256, (3, 32, 64), dtype=torch.uint8, generator=g)
    scales = torch.randint(0, 256, (3, 32, 4), dtype=torch.uint8, generator=g)
    for got, want in zip(prepare_experts(codes, scales), layout.prepare(codes, scales), strict=True):
        assert torch.equal(got, want)


@pytest.mark.gpu_only(reason="the fragment layout is stored for NVIDIA sm_90+")
@pytest.mark.parametrize("tokens", [3, 300])
def test_fragment_experts_run_within_the_row(device, tokens):
    if not packed_ptx(torch.device(device)):
        pytest.skip("the fragment layout is stored where the packed PTX runs")
    g = torch.Generator(device=device).manual_seed(tokens)
    hidden, inter, experts = 128, 64, 8
    moe = SparseMoE(hidden, inter, experts, 2, True, torch.bfloat16, device, mxfp4=True)
    moe.gate.weight.data.copy_(torch.randn(moe.gate.weight.shape, device=device, generator=g) * hidden**-0.5)
    w13 = (torch.randn(experts, 2 * inter, hidden, device=device, generator=g) * hidden**-0.5).to(torch.bfloat16)
    w2 = (torch.randn(experts, hidden, inter, device=device, generator=g) * inter**-0.5).to(torch.bfloat16)
    for e in range(experts):  # through the loader, an expert at a time, as a checkpoint gives them
        moe.weight_loader(moe.w13, w13[e, :inter], (e, "w1"))
        moe.weight_loader(moe.w13, w13[e, inter:], (e, "w3"))
        moe.weight_loader(moe.w2, w2[e], (e, "w2"))
    quantized = quantize_experts(w13, w2, interleaved=False)
    moe.process_weights_after_loading()
    assert moe.expert_layout == "fragment" and moe.w13_words.dtype == torch.int32
    x = torch.randn(tokens, hidden, device=device, generator=g).to(torch.bfloat16)
    got = moe(x)
    weights, ids = softmax_topk(F.linear(x, moe.gate.weight), 2, renormalize=True)
    args = (x, quantized["w13_codes"], quantized["w13_scales"], quantized["w2_codes"], quantized["w2_scales"])
    args = (*args, weights, ids)
    assert_lossy(families.MXFP4_MOE, got, mxfp4_moe_mirror(*args), mxfp4_moe_ideal(*args), "mxfp4_moe")
