"""KV-cache specs and allocation: geometry properties over drawn specs, the named DeepSeek facts, bad
arguments, and a negative control (a packed spec that uses its page size as the block stride)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from reference.kv.allocate import allocate_kv_cache
from reference.kv.attention import FullAttentionSpec
from reference.kv.mla import MLASpec
from reference.kv.packed_mla import DeepseekV4Spec, FP8DsMLASpec
from reference.kv.spec import round_up
from suites.kv.geometry import check_geometry

ATTN_DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn)


@st.composite
def specs(draw):
    kind = draw(st.sampled_from(["attention", "mla", "fp8_ds_mla", "dsv4"]))
    block_size = draw(st.integers(1, 20))
    if kind == "attention":
        dtype = draw(st.sampled_from(ATTN_DTYPES))
        kv_outer = draw(st.booleans())
        spec = FullAttentionSpec(
            block_size=block_size,
            num_kv_heads=draw(st.integers(1, 4)),
            head_size=draw(st.sampled_from([8, 16, 24])),
            head_size_v=draw(st.sampled_from([None, 8, 32])),
            dtype=dtype,
            layout=draw(st.sampled_from(["NHD", "HND"])),
            kv_outer=kv_outer,
        )
    elif kind == "mla":
        spec = MLASpec(block_size=block_size, dtype=draw(st.sampled_from(ATTN_DTYPES)))
    elif kind == "fp8_ds_mla":
        spec = FP8DsMLASpec(block_size=block_size)
    else:
        spec = DeepseekV4Spec(block_size=draw(st.integers(1, 70)))
    if len(spec.part_spans()) == 1 and draw(st.booleans()):  # a hybrid-padded page
        spec = spec.with_page_bytes(spec.page_bytes + spec.alignment * draw(st.integers(0, 3)))
    return spec


@given(spec=specs(), num_blocks=st.integers(1, 4), num_layers=st.integers(1, 4), packed=st.booleans())
def test_views_alias_exactly_their_segments(spec, num_blocks, num_layers, packed, device):
    packed = packed and len(spec.part_spans()) == 1
    cache = allocate_kv_cache(spec, num_blocks, num_layers, packed=packed, device=device)
    assert cache.buffer.numel() == num_blocks * num_layers * spec.page_bytes
    check_geometry(cache)


@given(spec=specs())
def test_page_bytes_follow_the_padding_rule(spec):
    """page = block_size * token_bytes, rounded up to 576 for DeepSeek-V4, or the hybrid padding."""
    assert spec.real_page_bytes == spec.block_size * spec.token_bytes
    if spec.page_bytes_padded is not None:
        assert spec.page_bytes == spec.page_bytes_padded >= spec.real_page_bytes
        assert spec.page_bytes % spec.alignment == 0
    elif isinstance(spec, DeepseekV4Spec):
        assert spec.page_bytes % 576 == 0 and 0 <= spec.page_bytes - spec.real_page_bytes < 576
    else:
        assert spec.page_bytes == spec.real_page_bytes


def test_token_bytes_named_facts():
    assert FP8DsMLASpec(block_size=1).token_bytes == 656 == 512 + 4 * 4 + 64 * 2
    assert DeepseekV4Spec(block_size=1).token_bytes == 584 == 448 + 64 * 2 + 7 + 1
    assert DeepseekV4Spec(block_size=1).page_bytes == 576 * 2  # 584 B rounds up to two 576 B units
    assert MLASpec(block_size=1).token_bytes == 576 * 2  # 576 bf16 values
    assert FP8DsMLASpec(block_size=64).page_bytes == 64 * 656
    full = FullAttentionSpec(block_size=16, num_kv_heads=8, head_size=128, head_size_v=64, dtype=torch.bfloat16)
    assert full.page_bytes == 16 * 8 * (128 + 64) * 2


def test_dsv4_packed_geometry_named_numbers():
    """vLLM's DeepSeek-V4 numbers (vllm#50276): 64 entries a block, 4 layers packed per block row."""
    spec = DeepseekV4Spec(block_size=64)
    assert (spec.real_page_bytes, spec.page_bytes) == (37_376, 37_440)
    geometry = spec.geometry(num_blocks=100, num_layers=4, packed=True)
    assert [g.regions[0].offset for g in geometry] == [0, 37_440, 74_880, 112_320]
    assert {g.regions[0].block_stride for g in geometry} == {149_760}
    assert {g.regions[0].nbytes for g in geometry} == {37_376}  # the span, not the stride
    end = sum(geometry[3].segments(99)[0])
    assert end == spec.buffer_bytes(100, 4) - (37_440 - 37_376)  # the top layer's last block ends at the gap


def test_dsv4_scale_rows_follow_all_data_rows():
    spec = DeepseekV4Spec(block_size=5)
    assert spec.token_segments(0) == ((0, 576), (5 * 576, 8))
    assert spec.token_segments(4) == ((4 * 576, 576), (5 * 576 + 4 * 8, 8))
    assert spec.page_bytes == round_up(5 * 584, 576) == 3456


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("kv_outer", [False, True], ids=["block-first", "kv-outer"])
def test_attention_element_lands_at_its_documented_byte(layout, kv_outer):
    spec = FullAttentionSpec(
        block_size=3, num_kv_heads=2, head_size=4, head_size_v=2, dtype=torch.float16, layout=layout, kv_outer=kv_outer
    )
    cache = allocate_kv_cache(spec, num_blocks=2, num_layers=2)
    k, v = cache.views[1]["k"], cache.views[1]["v"]
    block, token, head = 1, 2, 1
    index = (block, token, head) if layout == "NHD" else (block, head, token)
    k[index] = torch.tensor([1.0, 2.0, 3.0, 4.0])
    v[index] = torch.tensor([5.0, 6.0])
    (k_seg, v_seg) = cache.geometry[1].segments(block) if kv_outer else (cache.geometry[1].segments(block) * 2)
    inner = (token * 2 + head) if layout == "NHD" else (head * 3 + token)  # element rows of the block's K or V
    k_at = k_seg.offset + inner * 4 * 2
    v_at = v_seg.offset + inner * 2 * 2 + (0 if kv_outer else spec.k_block_bytes)
    assert cache.buffer[k_at : k_at + 8].view(torch.float16).tolist() == [1.0, 2.0, 3.0, 4.0]
    assert cache.buffer[v_at : v_at + 4].view(torch.float16).tolist() == [5.0, 6.0]
    written = (cache.buffer != 0).nonzero().flatten().tolist()
    assert set(written) <= set(range(k_at, k_at + 8)) | set(range(v_at, v_at + 4))  # nothing else was touched


def test_one_buffer_serves_every_layer():
    cache = allocate_kv_cache(MLASpec(block_size=4), num_blocks=3, num_layers=5, packed=True)
    for views in cache.views:
        assert views["latent"].untyped_storage().data_ptr() == cache.buffer.untyped_storage().data_ptr()


@pytest.mark.parametrize(
    ("make", "error", "name"),
    [
        (lambda: FullAttentionSpec(block_size=0, num_kv_heads=1, head_size=8), ValueError, "block_size"),
        (lambda: FullAttentionSpec(block_size=True, num_kv_heads=1, head_size=8), ValueError, "block_size"),
        (lambda: FullAttentionSpec(block_size=4, num_kv_heads=0, head_size=8), ValueError, "num_kv_heads"),
        (lambda: FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=-8), ValueError, "head_size"),
        (
            lambda: FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=8, head_size_v=0),
            ValueError,
            "head_size_v",
        ),
        (lambda: FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=8, dtype=torch.int32), TypeError, "dtype"),
        (lambda: FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=8, layout="NDH"), ValueError, "layout"),
        (
            lambda: FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=8, page_bytes_padded=8),
            ValueError,
            "page_bytes_padded",
        ),
        (
            lambda: FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=8, page_bytes_padded=129),
            ValueError,
            "page_bytes_padded",
        ),
        (
            lambda: FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=8, kv_outer=True, page_bytes_padded=256),
            ValueError,
            "page_bytes_padded",
        ),
        (lambda: MLASpec(block_size=4, kv_lora_rank=0), ValueError, "kv_lora_rank"),
        (lambda: MLASpec(block_size=4, dtype=torch.int8), TypeError, "dtype"),
        (lambda: DeepseekV4Spec(block_size=4, page_bytes_padded=4 * 584), ValueError, "page_bytes_padded"),
        (lambda: DeepseekV4Spec(block_size=4).token_segments(4), ValueError, "slot"),
        (lambda: FP8DsMLASpec(block_size=4).geometry(num_blocks=0), ValueError, "num_blocks"),
        (lambda: FP8DsMLASpec(block_size=4).geometry(num_blocks=2, num_layers=0), ValueError, "num_layers"),
        (
            lambda: FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=8, kv_outer=True).geometry(
                2, 2, packed=True
            ),
            ValueError,
            "packed",
        ),
        (lambda: allocate_kv_cache("spec", 2), TypeError, "spec"),
        (lambda: allocate_kv_cache(MLASpec(block_size=2), 2, fill=256), ValueError, "fill"),
        (
            lambda: MLASpec(block_size=2).views(
                torch.zeros(4 * 1152, dtype=torch.int8), MLASpec(block_size=2).geometry(2)[0]
            ),
            TypeError,
            "buffer",
        ),
        (
            lambda: MLASpec(block_size=2).views(
                torch.zeros(1152, dtype=torch.uint8), MLASpec(block_size=2).geometry(2)[0]
            ),
            ValueError,
            "buffer",
        ),
    ],
)
def test_bad_arguments_name_the_argument(make, error, name):
    with pytest.raises(error, match=name):
        make()


# Negative control: a packed spec whose block stride is its page size (the vLLM #50276 zeroer bug, on the
# spec side) puts layer l's block b + 1 on layer l + 1's block b; the geometry check must catch it.
@dataclasses.dataclass(frozen=True, kw_only=True)
class PageAsStrideSpec(DeepseekV4Spec):
    def block_stride(self, num_layers: int, packed: bool) -> int:
        return self.page_bytes


def test_negative_control_page_size_as_packed_block_stride():
    check_geometry(allocate_kv_cache(DeepseekV4Spec(block_size=3), num_blocks=3, num_layers=2, packed=True))
    faulty = allocate_kv_cache(PageAsStrideSpec(block_size=3), num_blocks=3, num_layers=2, packed=True)
    with pytest.raises(AssertionError, match="overlaps a segment of layer 0 block 1"):
        check_geometry(faulty)
