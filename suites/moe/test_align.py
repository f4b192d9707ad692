"""The token -> expert alignment contract (`reference.moe.align`): a named case with its expected bytes, the
reference passing its own contract checker over hypothesis-drawn routings (0, 1, odd and more than E x block
tokens, every token on one expert, empty experts, expert-parallel maps), the argument checks, and negative
controls: outputs with a planted bug (a token in the neighbouring expert's block, an off-by-one padded count, a
block labelled with the wrong expert, a lost token) that the checker must reject."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from reference.moe.align import Alignment, align_block_size, capacity, check_alignment


def test_named_case_bytes():
    topk_ids = torch.tensor([[0, 2], [2, 1], [0, 2]])  # flat: 0->e0, 1->e2, 2->e2, 3->e1, 4->e0, 5->e2; e3 empty
    got = align_block_size(topk_ids, num_experts=4, block_size=4)
    pad = 6
    assert capacity(6, 4, 4) == 20
    assert got.sorted_token_ids.tolist() == [0, 4, pad, pad, 3, pad, pad, pad, 1, 2, 5, pad] + [pad] * 8
    assert got.expert_ids.tolist() == [0, 1, 2, -1, -1]
    assert got.num_tokens_post_padded.tolist() == [12]
    ep = align_block_size(topk_ids, 4, 4, expert_map=torch.tensor([-1, 0, -1, 1]))  # e1, e3 on this rank
    assert ep.expert_ids.tolist() == [-1, 0, -1, -1, -1] and torch.equal(ep.sorted_token_ids, got.sorted_token_ids)


def test_capacity_is_the_worst_routing_exactly():
    # Fewer assignments than experts: the worst routing puts each on its own expert, a whole block apiece.
    assert capacity(8, 256, 16) == 8 * 16  # DeepSeek-V3 at one token: 8 blocks
    spread = torch.arange(8).reshape(1, 8)
    got = align_block_size(spread, num_experts=256, block_size=16)
    assert int(got.num_tokens_post_padded[0]) == capacity(8, 256, 16) and int(got.expert_ids.min()) == 0
    # More assignments than experts: every expert's run can waste block_size - 1 rows.
    assert capacity(9, 2, 4) == 9 + 2 * 3 + 1  # rounded up to whole blocks
    assert capacity(0, 64, 16) == 0


@st.composite
def routings(draw):
    experts = draw(st.sampled_from([1, 2, 8, 16, 64]))
    top_k = draw(st.integers(1, min(experts, 8)))
    block = draw(st.sampled_from([1, 4, 16, 64]))
    tokens = draw(st.one_of(st.sampled_from([0, 1, 7, experts * block + 3]), st.integers(0, 70)))
    skew = draw(st.sampled_from(["uniform", "one_expert", "few_experts"]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    if skew == "uniform":
        ids = torch.stack([torch.randperm(experts, generator=g)[:top_k] for _ in range(tokens)]) if tokens else None
    else:
        pool = 1 if skew == "one_expert" else min(experts, top_k + 1)
        first = torch.randperm(experts, generator=g)[:pool]
        rest = torch.tensor([e for e in range(experts) if e not in first.tolist()], dtype=torch.int64)
        order = torch.cat([first, rest])  # the tokens' first choices all come from `pool` experts
        ids = (
            torch.stack(
                [
                    order[torch.cat([torch.randperm(pool, generator=g), torch.arange(pool, experts)])][:top_k]
                    for _ in range(tokens)
                ]
            )
            if tokens
            else None
        )
    if ids is None:
        ids = torch.zeros(0, top_k, dtype=torch.int64)
    expert_map = None
    if draw(st.booleans()) and experts > 1:  # expert parallelism: a random half of the experts on this rank
        here = torch.randperm(experts, generator=g)[: experts // 2]
        expert_map = torch.full((experts,), -1, dtype=torch.int32)
        expert_map[here] = torch.arange(here.numel(), dtype=torch.int32)
    return ids, experts, block, expert_map


@given(routings())
def test_reference_meets_its_contract(case):
    ids, experts, block, expert_map = case
    check_alignment(align_block_size(ids, experts, block, expert_map), ids, experts, block, expert_map)


def _mutants(al: Alignment, n: int, block: int):
    ids = al.sorted_token_ids.clone()
    used = int(al.num_tokens_post_padded[0])
    yield "off-by-one padded count", dataclasses.replace(al, num_tokens_post_padded=al.num_tokens_post_padded + 1)
    yield "lost token", dataclasses.replace(al, sorted_token_ids=torch.where(ids == 0, n, ids))
    blocks = al.expert_ids.clone()
    blocks[0] = blocks[0] + 1
    yield "block labelled with the next expert", dataclasses.replace(al, expert_ids=blocks)
    real = (ids[:used] != n).nonzero().flatten()  # move the last real row of block 0 into the next expert's block
    first_block = real[real < block]
    if used > block and first_block.numel():
        moved = ids.clone()
        src, dst = int(first_block[-1]), block + block - 1
        moved[dst], moved[src] = moved[src], n
        yield "token in the neighbouring expert's block", dataclasses.replace(al, sorted_token_ids=moved)


def test_negative_controls_are_caught():
    ids = torch.tensor([[0, 1], [1, 2], [0, 1], [2, 3], [0, 3]])
    al = align_block_size(ids, 4, 4)
    seen = []
    for name, bad in _mutants(al, ids.numel(), 4):
        with pytest.raises(AssertionError):
            check_alignment(bad, ids, 4, 4)
        seen.append(name)
    assert len(seen) == 4, seen


def test_bad_arguments_are_named():
    ids = torch.tensor([[0, 1]])
    with pytest.raises(TypeError, match="topk_ids"):
        align_block_size(ids.float(), 4, 16)
    with pytest.raises(ValueError, match="topk_ids"):
        align_block_size(torch.tensor([[0, 4]]), 4, 16)
    with pytest.raises(ValueError, match="topk_ids"):
        align_block_size(torch.tensor([[0, 1, 2]]), 2, 16)
    with pytest.raises(ValueError, match="block_size"):
        align_block_size(ids, 4, 0)
    with pytest.raises(ValueError, match="expert_map"):
        align_block_size(ids, 4, 16, expert_map=torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match="expert_map"):
        align_block_size(ids, 4, 16, expert_map=torch.tensor([0, 0, -1, -1]))
