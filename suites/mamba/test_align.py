"""Alignment math of Mamba state caching (reference.mamba.align): align size, cache modes, block-aligned split,
the boundary rule, and the hybrid block size with the block sizes real hybrid models end up with
(Qwen3.5-4B -> 528, Qwen3.6-27B -> 784, Kimi-Linear -> 944)."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from reference.kv.attention import FullAttentionSpec
from reference.kv.hybrid import MambaSpec, gated_delta_net_state_shapes
from reference.kv.mla import MLASpec
from reference.mamba.align import (
    CacheGroup,
    hybrid_block_size,
    mamba_block_aligned_split,
    max_restorable_tokens,
    prefill_chunks,
    resolve_mamba_align_size,
    saved_state_positions,
)


def qwen35_text(num_v_heads: int) -> tuple[FullAttentionSpec, MambaSpec]:
    """Qwen3.5 text configs (as in suites/kv/test_hybrid.py): full attention 4 KV heads x 256, bf16; Gated
    DeltaNet 16 K heads and `num_v_heads` V heads of 128 (32: Qwen3.5-4B, 48: Qwen3.6-27B), conv kernel 4;
    conv state bf16, recurrent state fp32 (mamba_ssm_cache_dtype float32)."""
    conv, state = gated_delta_net_state_shapes(
        num_k_heads=16, num_v_heads=num_v_heads, head_k_dim=128, head_v_dim=128, conv_kernel=4
    )
    return (
        FullAttentionSpec(block_size=16, num_kv_heads=4, head_size=256),
        MambaSpec(shapes=(conv, state), dtypes=(torch.bfloat16, torch.float32)),
    )


def kimi_linear(tp: int) -> tuple[MLASpec, MambaSpec]:
    """Kimi-Linear-48B-A3B. Config (the public config.json of moonshotai/Kimi-Linear-48B-A3B-Instruct):
    linear_attn_config num_heads 32, head_dim 128, short_conv_kernel_size 4; MLA kv_lora_rank 512 +
    qk_rope_head_dim 64 (576 bf16 values a token). State shapes: vLLM
    `MambaStateShapeCalculator.kda_state_shape` (mamba_utils.py): conv states of q, k and v, each
    (conv_kernel - 1, num_heads * head_dim / tp), and the recurrent state (num_heads / tp, head_dim, head_dim).
    Conv bf16, recurrent fp32. The expected 944 is the block size at tp = 2 (tp = 1 gives 1888, tp = 4 gives
    480)."""
    conv = (3, 32 * 128 // tp)
    return (
        MLASpec(block_size=16),
        MambaSpec(shapes=(conv, conv, conv, (32 // tp, 128, 128)), dtypes=(torch.bfloat16,) * 3 + (torch.float32,)),
    )


@pytest.mark.parametrize(
    ("model", "spec", "block", "mamba_page"),
    [
        ("Qwen3.5-4B", qwen35_text(32), 528, 2_146_304),
        ("Qwen3.6-27B", qwen35_text(48), 784, 3_207_168),
        ("Kimi-Linear tp2", kimi_linear(2), 944, 3 * 3 * 2048 * 2 + 16 * 128 * 128 * 4),
    ],
)
def test_published_hybrid_block_sizes(model, spec, block, mamba_page):
    attention, mamba = spec
    assert mamba.page_bytes == mamba_page, model
    got_block, padded = hybrid_block_size(attention, mamba, kernel_block_alignment=16)
    assert got_block == block, model
    assert padded == block * attention.token_bytes >= mamba_page


def test_kimi_linear_at_other_parallelisms():
    assert hybrid_block_size(*kimi_linear(1), kernel_block_alignment=16)[0] == 1888
    assert hybrid_block_size(*kimi_linear(4), kernel_block_alignment=16)[0] == 480


def test_checkpoint_alignment_rounds_to_the_lcm():
    """vLLM#25752 ("all" mode, chunk 256): 788 kB Mamba page, 2 kB per attention token -> 394 tokens, rounded
    up to 512; an alignment of lcm(16, 256) = 256 gives the same."""
    attention = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=512)  # 2048 B a token
    mamba = MambaSpec(shapes=((788 * 1024,),), dtypes=(torch.uint8,))
    assert hybrid_block_size(attention, mamba, kernel_block_alignment=16)[0] == 400
    assert hybrid_block_size(attention, mamba, kernel_block_alignment=16, checkpoint_alignment=256)[0] == 512


@given(
    heads=st.integers(1, 8),
    head_size=st.sampled_from([64, 128, 256]),
    state_kb=st.integers(1, 4096),
    kernel=st.sampled_from([1, 16, 32, 64]),
    checkpoint=st.sampled_from([1, 8, 48, 64, 256]),
)
def test_hybrid_block_is_a_multiple_of_both_and_pages_end_equal(heads, head_size, state_kb, kernel, checkpoint):
    attention = FullAttentionSpec(block_size=1, num_kv_heads=heads, head_size=head_size)
    mamba = MambaSpec(shapes=((state_kb, 256),), dtypes=(torch.float32,))
    block, padded = hybrid_block_size(attention, mamba, kernel_block_alignment=kernel, checkpoint_alignment=checkpoint)
    align = math.lcm(kernel, checkpoint)
    assert block % kernel == 0 and block % checkpoint == 0
    assert padded == block * attention.token_bytes >= mamba.real_page_bytes  # pages end equal
    assert (block - align) * attention.token_bytes < mamba.real_page_bytes  # and no smaller multiple fits


def test_resolve_mamba_align_size():
    attention = CacheGroup(tokens_per_block=16, blocks_per_chunk=8)
    assert resolve_mamba_align_size([attention]) is None
    assert resolve_mamba_align_size([attention, CacheGroup(tokens_per_block=528, mamba_cache_mode="none")]) is None
    align = CacheGroup(tokens_per_block=16, blocks_per_chunk=4, mamba_cache_mode="align")
    assert resolve_mamba_align_size([attention, align]) == 64
    every = CacheGroup(tokens_per_block=32, blocks_per_chunk=2, mamba_cache_mode="all")  # after vLLM#51100
    assert resolve_mamba_align_size([align, every]) == 64
    with pytest.raises(ValueError, match="groups: Mamba groups disagree"):
        resolve_mamba_align_size([align, CacheGroup(tokens_per_block=16, mamba_cache_mode="all")])
    with pytest.raises(TypeError, match="groups"):
        resolve_mamba_align_size([16])


@pytest.mark.parametrize(
    ("num_tokens", "align", "want"),
    [
        (32, 16, 16),  # max_restorable_tokens' worked example: cap 31 -> 16; restore state@16, recompute 16..31
        (33, 16, 32),  # "block-mid": cap 32 -> 32; restore state@32, recompute token 32
        (31, 16, 16),
        (16, 16, 0),
        (1, 16, 0),
        (17, 16, 16),
    ],
)
def test_boundary_rule_worked_examples(num_tokens, align, want):
    assert max_restorable_tokens(num_tokens, align) == want


@given(num_tokens=st.integers(1, 5000), align=st.integers(1, 600))
def test_boundary_rule_is_the_last_boundary_before_the_last_token(num_tokens, align):
    hit = max_restorable_tokens(num_tokens, align)
    assert hit % align == 0 and hit <= num_tokens - 1 < hit + align
    bug = max_restorable_tokens(num_tokens, align, fault="hit_includes_last_token")
    assert bug == (num_tokens if num_tokens % align == 0 else hit)  # the fault differs exactly at boundaries


@pytest.mark.parametrize(
    ("mode", "want"),
    [
        ("none", ()),
        ("align", (16, 48)),
        ("all", (16, 32, 48)),
    ],
)
def test_cache_modes_save_states_where_vllm_does(mode, want):
    assert saved_state_positions(mode, 16, [16, 48, 53]) == want


@pytest.mark.parametrize(
    ("kwargs", "want"),
    [
        # prefilling, chunk ends before the last boundary (48): length rounded down to a block multiple
        (dict(num_tokens=50, num_computed_tokens=0, num_new_tokens=40), 32),
        # straddles the last boundary: cut to end exactly there
        (dict(num_tokens=50, num_computed_tokens=32, num_new_tokens=18), 16),
        # the tail after the last boundary: unchanged
        (dict(num_tokens=50, num_computed_tokens=48, num_new_tokens=2), 2),
        # ends exactly on the last boundary: unchanged
        (dict(num_tokens=48, num_computed_tokens=16, num_new_tokens=32), 32),
        # the budget cannot reach the next boundary: 0 (the request waits)
        (dict(num_tokens=50, num_computed_tokens=0, num_new_tokens=10), 0),
        # EAGLE moves the last boundary one block earlier (32): the straddling chunk is cut there
        (dict(num_tokens=50, num_computed_tokens=16, num_new_tokens=34, use_eagle=True), 16),
        # decoding (all prompt tokens computed): nothing to align
        (dict(num_tokens=51, num_computed_tokens=50, num_new_tokens=1), 1),
    ],
)
def test_block_aligned_split_cases(kwargs, want):
    kwargs.setdefault("num_prompt_tokens", min(kwargs["num_tokens"], 50))
    assert mamba_block_aligned_split(block_size=16, **kwargs) == want


@given(
    num_tokens=st.integers(1, 300),
    block=st.integers(1, 40),
    blocks_per_budget=st.integers(1, 4),
    extra=st.integers(0, 39),
    data=st.data(),
)
def test_block_aligned_chunks_end_on_boundaries_and_resume_identically(
    num_tokens, block, blocks_per_budget, extra, data
):
    budget = block * blocks_per_budget + extra % block
    chunks = prefill_chunks(num_tokens, 0, budget, block)
    assert chunks[0][0] == 0 and chunks[-1][1] == num_tokens
    assert all(a[1] == b[0] for a, b in itertools.pairwise(chunks))
    assert all(0 < e - s <= budget for s, e in chunks)
    last = num_tokens - num_tokens % block
    ends = [e for _, e in chunks]
    assert all(e % block == 0 for e in ends if e <= last)  # every chunk up to the last boundary ends on one
    if last:
        assert last in ends  # the last full block's state is always reached, hence saveable in align mode
    # memoryless: a run resumed at any chunk end cuts the rest exactly as the cold run did
    i = data.draw(st.integers(0, len(chunks) - 1))
    assert prefill_chunks(num_tokens, chunks[i][0], budget, block) == chunks[i:]


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda: max_restorable_tokens(0, 16), "num_tokens"),
        (lambda: max_restorable_tokens(16, 0), "align"),
        (lambda: max_restorable_tokens(16, 16, fault="off"), "fault"),
        (lambda: saved_state_positions("some", 16, [16]), "mode"),
        (lambda: saved_state_positions("all", 16, [16, 16]), "step_ends"),
        (lambda: CacheGroup(tokens_per_block=0), "tokens_per_block"),
        (lambda: CacheGroup(tokens_per_block=16, mamba_cache_mode="fine"), "mamba_cache_mode"),
        (
            lambda: mamba_block_aligned_split(
                num_tokens=8, num_prompt_tokens=8, num_computed_tokens=-1, num_new_tokens=8, block_size=4
            ),
            "num_computed_tokens",
        ),
        (lambda: prefill_chunks(50, 0, 10, 16), "token_budget"),
        (lambda: hybrid_block_size(*qwen35_text(32), kernel_block_alignment=0), "kernel_block_alignment"),
    ],
)
def test_bad_arguments_name_the_argument(call, name):
    with pytest.raises(ValueError, match=name):
        call()
