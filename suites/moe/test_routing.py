"""MoE routing references (`reference.moe.routing`) against transformers 5.x's own routers (Mixtral, Qwen3-MoE,
DeepSeek-V3, gpt-oss) on random weights, named cases with expected values, the stated conventions (DeepSeek-V3's
correction bias chooses but does not weigh; renormalization per model), the argument checks, and a negative
control: a router that weighs with the biased scores is caught by the transformers comparison."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from reference.moe import routing

transformers = pytest.importorskip("transformers")


def _close(got, want) -> bool:
    return torch.allclose(got.double(), want.double(), rtol=1e-6, atol=1e-7)


def _by_id(weights, ids):
    """(weights, ids) with each token's entries sorted by expert id: a sum does not care about the order."""
    order = ids.argsort(dim=-1)
    return weights.gather(1, order), ids.gather(1, order)


def _hidden(tokens: int, hidden: int, seed: int) -> torch.Tensor:
    return torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("norm_topk_prob", [True, False])
def test_softmax_topk_is_qwen3_moe_router(norm_topk_prob):
    from transformers.models.qwen3_moe.configuration_qwen3_moe import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter

    config = Qwen3MoeConfig(hidden_size=32, num_experts=16, num_experts_per_tok=4, norm_topk_prob=norm_topk_prob)
    router = Qwen3MoeTopKRouter(config)
    torch.nn.init.normal_(router.weight, generator=torch.Generator().manual_seed(1))
    x = _hidden(37, 32, 2)
    logits, want_w, want_ids = router(x)
    got_w, got_ids = routing.softmax_topk(logits, 4, renormalize=norm_topk_prob)
    assert torch.equal(got_ids, want_ids) and _close(got_w, want_w)


def test_softmax_topk_renormalized_is_mixtral_router():
    from transformers.models.mixtral.configuration_mixtral import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralTopKRouter

    router = MixtralTopKRouter(MixtralConfig(hidden_size=32, num_local_experts=8, num_experts_per_tok=2))
    torch.nn.init.normal_(router.weight, generator=torch.Generator().manual_seed(3))
    logits, want_w, want_ids = router(_hidden(29, 32, 4))
    got_w, got_ids = routing.softmax_topk(logits, 2, renormalize=True)
    assert torch.equal(got_ids, want_ids) and _close(got_w, want_w)


def test_topk_softmax_is_gpt_oss_router():
    from transformers.models.gpt_oss.configuration_gpt_oss import GptOssConfig
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssTopKRouter

    router = GptOssTopKRouter(GptOssConfig(hidden_size=32, num_local_experts=32, num_experts_per_tok=4))
    g = torch.Generator().manual_seed(5)
    torch.nn.init.normal_(router.weight, generator=g)
    torch.nn.init.normal_(router.bias, generator=g)
    logits, want_w, want_ids = router(_hidden(23, 32, 6))
    got_w, got_ids = routing.topk_softmax(logits, 4)
    assert torch.equal(got_ids, want_ids) and _close(got_w, want_w)


def _deepseek_router(n_group: int, topk_group: int, top_k: int, norm: bool, seed: int):
    from transformers.models.deepseek_v3.configuration_deepseek_v3 import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

    config = DeepseekV3Config(
        hidden_size=32,
        n_routed_experts=32,
        num_experts_per_tok=top_k,
        n_group=n_group,
        topk_group=topk_group,
        norm_topk_prob=norm,
        routed_scaling_factor=2.5,
    )
    router = DeepseekV3TopkRouter(config)
    g = torch.Generator().manual_seed(seed)
    torch.nn.init.normal_(router.weight, generator=g)
    router.e_score_correction_bias.copy_(torch.randn(32, generator=g) / 4)
    return router


def _deepseek(logits, router, weigh_biased: bool = False):
    weights, ids = routing.grouped_topk(
        logits,
        router.top_k,
        router.num_group,
        router.topk_group,
        router.e_score_correction_bias,
        router.routed_scaling_factor,
        router.norm_topk_prob,
    )
    if weigh_biased:  # the planted bug: weights from the scores the bias moved
        biased = torch.sigmoid(logits.float()) + router.e_score_correction_bias
        weights = biased.gather(1, ids)
        if router.norm_topk_prob:
            weights = weights / weights.sum(-1, keepdim=True)
        weights = weights * router.routed_scaling_factor
    return weights, ids


@pytest.mark.parametrize(
    ("n_group", "topk_group", "top_k", "norm"), [(8, 4, 8, True), (4, 2, 6, False), (1, 1, 3, True)]
)
def test_grouped_topk_is_deepseek_v3_router(n_group, topk_group, top_k, norm):
    router = _deepseek_router(n_group, topk_group, top_k, norm, seed=7)
    x = _hidden(41, 32, 8)
    logits, want_w, want_ids = router(x)
    got_w, got_ids = _by_id(*_deepseek(logits, router))
    want_w, want_ids = _by_id(want_w, want_ids)
    assert torch.equal(got_ids, want_ids) and _close(got_w, want_w)


def test_negative_control_biased_weights_are_caught():
    router = _deepseek_router(8, 4, 8, True, seed=9)
    logits, want_w, want_ids = router(_hidden(16, 32, 10))
    got_w, got_ids = _by_id(*_deepseek(logits, router, weigh_biased=True))
    want_w, want_ids = _by_id(want_w, want_ids)
    assert torch.equal(got_ids, want_ids) and not _close(got_w, want_w)


def test_named_cases():
    logits = torch.tensor([[0.0, math.log(3.0), math.log(6.0)]])  # softmax: 0.1, 0.3, 0.6
    w, ids = routing.softmax_topk(logits, 2, renormalize=False)
    assert ids.tolist() == [[2, 1]] and w[0].tolist() == pytest.approx([0.6, 0.3], rel=1e-6)
    w, _ = routing.softmax_topk(logits, 2, renormalize=True)
    assert w[0].tolist() == pytest.approx([2 / 3, 1 / 3], rel=1e-6)
    w, ids = routing.topk_softmax(torch.tensor([[1.0, 3.0, 2.0]]), 2)  # softmax over (3, 2) only
    e = math.e
    assert ids.tolist() == [[1, 2]] and w[0].tolist() == pytest.approx([e / (e + 1), 1 / (e + 1)], rel=1e-6)
    # DeepSeek-V3: the bias makes expert 0 win over expert 1, but its weight stays sigmoid(0) = 0.5
    w, ids = routing.grouped_topk(torch.tensor([[0.0, 1.0, -5.0, -5.0]]), 1, 1, 1, torch.tensor([1.0, 0, 0, 0]), 2.0)
    assert ids.tolist() == [[0]] and w[0].tolist() == pytest.approx([2.0])  # renormalized 1.0, times 2.0
    w, _ = routing.grouped_topk(torch.tensor([[0.0, 1.0, -5.0, -5.0]]), 1, 1, 1, None, 1.0, renormalize=False)
    assert w[0].tolist() == pytest.approx([1 / (1 + math.exp(-1))])


@given(
    tokens=st.integers(0, 9),
    groups=st.sampled_from([(1, 1), (4, 2), (8, 3)]),
    top_k=st.integers(1, 6),
    seed=st.integers(0, 2**31 - 1),
)
def test_grouped_topk_picks_only_from_kept_groups(tokens, groups, top_k, seed):
    n_group, topk_group = groups
    g = torch.Generator().manual_seed(seed)
    logits, bias = torch.randn(tokens, 32, generator=g), torch.randn(32, generator=g)
    w, ids = routing.grouped_topk(logits, top_k, n_group, topk_group, bias, 1.0)
    assert w.shape == ids.shape == (tokens, top_k)
    per = 32 // n_group
    for t in range(tokens):
        choice = torch.sigmoid(logits[t]) + bias
        kept = choice.view(n_group, per).topk(2).values.sum(-1).topk(topk_group).indices.tolist()
        assert len(set(ids[t].tolist())) == top_k and {i // per for i in ids[t].tolist()} <= set(kept)
        assert w[t].sum().item() == pytest.approx(1.0, rel=1e-5)
        assert torch.allclose(w[t] * torch.sigmoid(logits[t])[ids[t]].sum(), torch.sigmoid(logits[t])[ids[t]])


def test_bad_arguments_are_named():
    logits = torch.randn(3, 8)
    with pytest.raises(ValueError, match="top_k"):
        routing.softmax_topk(logits, 9, True)
    with pytest.raises(ValueError, match="top_k"):
        routing.topk_softmax(logits, 0)
    with pytest.raises(TypeError, match="router_logits"):
        routing.softmax_topk(torch.ones(3, 8, dtype=torch.int64), 2, True)
    with pytest.raises(ValueError, match="router_logits"):
        routing.softmax_topk(torch.randn(8), 2, True)
    with pytest.raises(ValueError, match="n_group"):
        routing.grouped_topk(logits, 2, 3, 1)
    with pytest.raises(ValueError, match="topk_group"):
        routing.grouped_topk(logits, 2, 2, 3)
    with pytest.raises(ValueError, match="correction_bias"):
        routing.grouped_topk(logits, 2, 2, 1, torch.zeros(7))
    with pytest.raises(ValueError, match="top_k"):
        routing.grouped_topk(logits, 5, 2, 1)  # one group of 4 experts kept
