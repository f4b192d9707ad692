"""Hybrid page unification: attention block sizes grown and pages padded so attention and Mamba pages are
equal; expected numbers from public vLLM logs and PRs."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from reference.kv.allocate import allocate_kv_cache
from reference.kv.attention import FullAttentionSpec
from reference.kv.hybrid import (
    MambaSpec,
    gated_delta_net_state_shapes,
    hybrid_attention_block_size,
    mamba2_state_shapes,
    unify_attention_mamba,
    unify_page_sizes,
)
from reference.kv.mla import MLASpec
from reference.kv.packed_mla import DeepseekV4Spec, FP8DsMLASpec
from suites.kv.geometry import check_geometry


def qwen35_like(num_v_heads: int) -> tuple[FullAttentionSpec, MambaSpec]:
    """Configuration assumed (Qwen3.5 text models): attention 4 KV heads x 256 bf16; Gated DeltaNet 16 K and
    `num_v_heads` V heads of 128, conv kernel 4, bf16 conv state, fp32 recurrent state."""
    conv, state = gated_delta_net_state_shapes(
        num_k_heads=16, num_v_heads=num_v_heads, head_k_dim=128, head_v_dim=128, conv_kernel=4
    )
    attention = FullAttentionSpec(block_size=16, num_kv_heads=4, head_size=256, dtype=torch.bfloat16)
    return attention, MambaSpec(shapes=(conv, state), dtypes=(torch.bfloat16, torch.float32))


@pytest.mark.parametrize(
    ("num_v_heads", "mamba_page", "block", "padding_percent"),
    [
        (32, 2_146_304, 528, "0.76"),  # vllm#37467 log: "block size to 528 tokens", "Padding mamba page size by 0.76%"
        (48, 3_207_168, 784, "0.13"),  # vllm#50507: Qwen3.6-27B, a 784-token block
    ],
)
def test_qwen35_like_unification(num_v_heads, mamba_page, block, padding_percent):
    attention, mamba = qwen35_like(num_v_heads)
    assert mamba.page_bytes == mamba_page
    attention, mamba = unify_attention_mamba(attention, mamba, alignment=16)
    assert attention.block_size == block
    assert mamba.page_bytes == attention.page_bytes == block * 4 * 256 * 2 * 2
    assert f"{(mamba.page_bytes - mamba_page) / mamba_page * 100:.2f}" == padding_percent


def test_chunk_aligned_block_from_the_mamba2_prefix_caching_pr():
    """vllm#25752: "mamba page size = 788kB, attn_1_token = 2kB -> fits ~394 tokens, then round up to a
    multiple of chunk_size (256) -> 512 tokens"."""
    assert hybrid_attention_block_size(2048, 788 * 1024, alignment=256) == 512
    assert hybrid_attention_block_size(2048, 788 * 1024, alignment=1) == 394


def test_mamba2_state_shapes_replicate_groups_across_shards():
    conv, ssm = mamba2_state_shapes(
        intermediate_size=8192, n_groups=1, num_heads=128, head_dim=64, state_size=128, conv_kernel=4, tp=1
    )
    assert (conv, ssm) == ((3, 8192 + 2 * 128), (128, 64, 128))
    conv, ssm = mamba2_state_shapes(
        intermediate_size=8192, n_groups=1, num_heads=128, head_dim=64, state_size=128, conv_kernel=4, tp=4
    )  # 1 group replicated to 4, one per shard
    assert (conv, ssm) == ((3, (8192 + 2 * 4 * 128) // 4), (32, 64, 128))


def test_a_block_size_already_large_enough_is_kept():
    attention, mamba = qwen35_like(32)
    big = attention.with_block_size(1024)
    grown, padded = unify_attention_mamba(big, mamba, alignment=16)
    assert grown.block_size == 1024 and padded.page_bytes == big.page_bytes


@given(
    heads=st.integers(1, 8),
    head_size=st.sampled_from([64, 128, 256]),
    state=st.integers(1, 64),
    alignment=st.sampled_from([1, 16, 64]),
    block=st.sampled_from([16, 64]),
)
def test_unified_pages_are_equal_and_minimal(heads, head_size, state, alignment, block):
    attention = FullAttentionSpec(block_size=block, num_kv_heads=heads, head_size=head_size)
    mamba = MambaSpec(shapes=((3, 256 * state), (state, 32, 32)), dtypes=(torch.bfloat16, torch.float32))
    grown, padded = unify_attention_mamba(attention, mamba, alignment)
    assert grown.page_bytes == padded.page_bytes >= mamba.real_page_bytes
    if grown.block_size != block:  # grown: a multiple of the alignment, one alignment step less would not fit
        assert grown.block_size % alignment == 0
        assert (grown.block_size - alignment) * attention.token_bytes < mamba.real_page_bytes


def test_unify_page_sizes_grows_pads_or_refuses():
    mla = MLASpec(block_size=16)  # 16 * 1152 = 18,432 B
    full = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=72)  # 16 * 288 = 4,608 B: grows x4
    ds = FP8DsMLASpec(block_size=16)  # 16 * 656 = 10,496 B: does not divide, padded
    mamba = MambaSpec(shapes=((100,),), dtypes=(torch.float32,))
    out = unify_page_sizes({"mla": mla, "full": full, "ds": ds, "mamba": mamba})
    assert {name: spec.page_bytes for name, spec in out.items()} == dict.fromkeys(out, 18_432)
    assert out["mla"] is mla and out["full"].block_size == 64 and out["ds"].page_bytes_padded == 18_432
    assert out["ds"].block_size == 16 and out["mamba"].real_page_bytes == 400
    kv_outer = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=100, kv_outer=True)
    with pytest.raises(ValueError, match="specs: 'kv'"):
        unify_page_sizes({"mla": mla, "kv": kv_outer})


def test_padded_attention_pages_still_pass_the_geometry_check():
    attention, mamba = unify_attention_mamba(
        DeepseekV4Spec(block_size=4), MambaSpec(shapes=((5000,),), dtypes=(torch.float32,)), alignment=1
    )
    assert attention.block_size == 35  # ceil(20,000 / 584)
    assert attention.page_bytes == mamba.page_bytes == 20_736  # 35 * 584 = 20,440 rounded up to 36 * 576
    check_geometry(allocate_kv_cache(attention, num_blocks=2, num_layers=3, packed=True))
    padded = unify_page_sizes({"a": FP8DsMLASpec(block_size=2), "b": MLASpec(block_size=2)})["a"]
    check_geometry(allocate_kv_cache(padded, num_blocks=3, num_layers=2, packed=True))


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda: hybrid_attention_block_size(0, 10, 16), "attn_token_bytes"),
        (lambda: hybrid_attention_block_size(10, 10, 0), "alignment"),
        (lambda: MambaSpec(shapes=((3, 4),), dtypes=()), "shapes"),
        (lambda: MambaSpec(shapes=((3, 0),), dtypes=(torch.float32,)), "shapes"),
        (lambda: MambaSpec(shapes=((3, 4),), dtypes=(torch.float32,), page_bytes_padded=47), "page_bytes_padded"),
        (
            lambda: gated_delta_net_state_shapes(
                num_k_heads=16, num_v_heads=32, head_k_dim=128, head_v_dim=128, conv_kernel=0
            ),
            "conv_kernel",
        ),
        (lambda: unify_page_sizes({}), "specs"),
        # shardings vLLM's mixers refuse (the shapes would silently floor or carry a negative group count)
        (
            lambda: mamba2_state_shapes(
                intermediate_size=8192, n_groups=3, num_heads=128, head_dim=64, state_size=128, conv_kernel=4, tp=2
            ),
            "n_groups",
        ),
        (
            lambda: mamba2_state_shapes(
                intermediate_size=384, n_groups=1, num_heads=6, head_dim=64, state_size=128, conv_kernel=4, tp=4
            ),
            "num_heads",
        ),
        (
            lambda: gated_delta_net_state_shapes(
                num_k_heads=4, num_v_heads=6, head_k_dim=128, head_v_dim=128, conv_kernel=4, tp=4
            ),
            "num_v_heads",
        ),
    ],
)
def test_bad_arguments_name_the_argument(call, name):
    with pytest.raises(ValueError, match=name):
        call()


def test_wrong_spec_types_are_refused():
    with pytest.raises(TypeError, match="attention"):
        unify_attention_mamba(
            MambaSpec(shapes=((1,),), dtypes=(torch.float32,)), MambaSpec(shapes=((1,),), dtypes=(torch.float32,)), 16
        )
    with pytest.raises(TypeError, match="mamba"):
        unify_attention_mamba(MLASpec(block_size=1), MLASpec(block_size=1), 16)
