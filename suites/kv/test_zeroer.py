"""KV block zeroer: the segment table crossed through the real constructors (spec -> allocator -> zeroer) and
checked on its meaning, then the Triton kernel run on the same geometry over canary bytes: inside the
segments of the cleared blocks zero, everything else untouched, bit for bit with the reference."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kernels.tolerances import assert_exact
from reference.kv.allocate import allocate_kv_cache
from reference.kv.attention import FullAttentionSpec
from reference.kv.hybrid import MambaSpec, unify_attention_mamba
from reference.kv.mla import MLASpec
from reference.kv.packed_mla import DeepseekV4Spec, FP8DsMLASpec
from reference.kv.zeroer import zero_kv_blocks, zeroer_table
from suites.kv.zeroer_geometry import check_zeroer_table

kernel = pytest.importorskip("kernels.kv_zeroer")
MAMBA = MambaSpec(shapes=((3, 40), (2, 8, 8)), dtypes=(torch.bfloat16, torch.float32))


@st.composite
def specs(draw):
    kind = draw(st.sampled_from(["attention", "mla", "fp8_ds_mla", "dsv4"]))
    block_size = draw(st.integers(1, 6))
    if kind == "attention":  # head size 3 in fp8 gives odd byte offsets: the kernel's byte-wide path
        spec = FullAttentionSpec(
            block_size=block_size,
            num_kv_heads=draw(st.integers(1, 2)),
            head_size=draw(st.sampled_from([3, 8, 16])),
            head_size_v=draw(st.sampled_from([None, 8])),
            layout=draw(st.sampled_from(["NHD", "HND"])),
            dtype=draw(st.sampled_from([torch.bfloat16, torch.float32, torch.float8_e4m3fn])),
            kv_outer=draw(st.booleans()),
        )
    elif kind == "mla":
        spec = MLASpec(
            block_size=block_size,
            kv_lora_rank=draw(st.sampled_from([8, 512])),
            rope_dim=8,
            dtype=draw(st.sampled_from([torch.bfloat16, torch.float8_e4m3fn])),
        )
    elif kind == "fp8_ds_mla":
        spec = FP8DsMLASpec(block_size=block_size)
    else:
        spec = DeepseekV4Spec(block_size=block_size)
    if len(spec.part_spans()) == 1 and draw(st.booleans()):  # a hybrid-padded page
        spec = spec.with_page_bytes(spec.page_bytes + spec.alignment * draw(st.integers(1, 3)))
    return spec


@st.composite
def problems(draw):
    """Attention groups (and maybe a Mamba group) sharing one block pool, and the blocks to clear."""
    num_blocks = draw(st.integers(1, 4))
    groups = []
    for _ in range(draw(st.integers(1, 2))):
        spec = draw(specs())
        packed = draw(st.booleans()) and len(spec.part_spans()) == 1
        groups.append((spec, draw(st.integers(1, 3)), packed))
    return dict(
        num_blocks=num_blocks,
        groups=groups,
        mamba=draw(st.booleans()),
        seed=draw(st.integers(0, 2**31 - 1)),
        block_ids=draw(st.lists(st.integers(0, num_blocks - 1), max_size=3)),
    )


def build(p: dict, device: str) -> dict:
    groups = {
        f"attn{i}": allocate_kv_cache(spec, p["num_blocks"], layers, packed=packed, device=device)
        for i, (spec, layers, packed) in enumerate(p["groups"])
    }
    if p["mamba"]:
        groups["mamba"] = MAMBA
    return groups


def fill_canaries(groups: dict, seed: int) -> None:
    """Every byte of every cache a non-zero canary (1..255) from a seeded generator."""
    generator = torch.Generator().manual_seed(seed)
    for group in groups.values():
        if not isinstance(group, MambaSpec):
            canary = torch.randint(1, 256, (group.buffer.numel(),), dtype=torch.uint8, generator=generator)
            group.buffer.copy_(canary.to(group.buffer.device))


def expected_after(groups: dict, block_ids: list[int]) -> dict[str, torch.Tensor]:
    """Each attention cache's bytes once `block_ids` are cleared, from the spec's own segments()."""
    out = {}
    for name, group in groups.items():
        if isinstance(group, MambaSpec):
            continue
        want = group.buffer.cpu().clone()
        for layer in group.geometry:
            for block in block_ids:
                for offset, nbytes in layer.segments(block):
                    want[offset : offset + nbytes] = 0
        out[name] = want
    return out


def check_zeroing(groups: dict, block_ids: list[int], device: str, zero=kernel.zero_kv_blocks) -> None:
    """Canaries everywhere, clear `block_ids` with `zero` and with the reference, compare with the segments."""
    table = zeroer_table(groups)
    want = expected_after(groups, block_ids)
    ids = torch.tensor(block_ids, dtype=torch.int32, device=device)
    copies = [buffer.clone() for buffer in table.buffers]
    zero(list(table.buffers), table.tensor(), ids)
    zero_kv_blocks(copies, table.tensor(), ids)
    for name, group in groups.items():
        if name in want:
            index = next(i for i, b in enumerate(table.buffers) if b is group.buffer)
            assert_exact(group.buffer, want[name], f"{name}: kernel-cleared bytes vs the segments of {block_ids}")
            assert_exact(copies[index], want[name], f"{name}: reference-cleared bytes vs the segments")


# ---- geometry regression: the table's meaning, through the real constructors ----


@given(p=problems())
def test_table_means_what_the_allocation_holds(p):
    groups = build(p, "cpu")
    table = zeroer_table(groups)
    check_zeroer_table(groups, table)


def dsv4_packed(num_blocks: int = 100, device: str = "cpu") -> dict:
    """vLLM's DeepSeek-V4 numbers (vllm#50276): 64 entries a block, 4 layers packed in each block row."""
    return {
        "dsv4": allocate_kv_cache(DeepseekV4Spec(block_size=64), num_blocks, num_layers=4, packed=True, device=device)
    }


def test_dsv4_packed_table_named_numbers():
    groups = dsv4_packed()
    table = zeroer_table(groups)
    assert [r.offset for r in table.rows] == [0, 37_440, 74_880, 112_320]
    assert {r.block_stride for r in table.rows} == {149_760}  # the stride: 4 layers' pages
    assert {r.nbytes for r in table.rows} == {37_376}  # the span: 64 x 584, not the 37,440 B page
    top = table.rows[3]
    end = top.offset + 99 * top.block_stride + top.nbytes
    assert end == groups["dsv4"].buffer.numel() - (37_440 - 37_376)  # ends at the top layer's padding
    check_zeroer_table(groups, table)


def test_hybrid_mamba_groups_are_not_zeroed_and_padding_is_not_cleared():
    attention, mamba = unify_attention_mamba(
        DeepseekV4Spec(block_size=4), MambaSpec(shapes=((5000,),), dtypes=(torch.float32,)), alignment=1
    )
    groups = {"mamba": mamba, "attn": allocate_kv_cache(attention, num_blocks=3, num_layers=2, packed=True)}
    table = zeroer_table(groups)
    assert {owner for owner, _ in table.owners} == {"attn"}
    assert {r.nbytes for r in table.rows} == {35 * 584}  # 20,440 B of content in the 20,736 B unified page
    assert {r.block_stride for r in table.rows} == {2 * 20_736}
    check_zeroer_table(groups, table)
    assert zeroer_table({"mamba": mamba}).rows == ()


def test_groups_sharing_a_buffer_share_its_index():
    cache = allocate_kv_cache(MLASpec(block_size=2, kv_lora_rank=8, rope_dim=8), num_blocks=3, num_layers=2)
    table = zeroer_table({"a": cache, "b": cache})
    assert len(table.buffers) == 1 and {r.buffer for r in table.rows} == {0}


# Negative controls of the metadata check: the two conflations of vLLM #50276, each named by its branch.
def test_negative_control_table_with_page_size_as_stride():
    groups = dsv4_packed(num_blocks=4)
    table = zeroer_table(groups)
    faulty = dataclasses.replace(table, rows=tuple(r._replace(block_stride=37_440) for r in table.rows))
    with pytest.raises(AssertionError, match=r"packed 'dsv4' layer 0: .*page size \(37440\) used as the stride"):
        check_zeroer_table(groups, faulty)
    whole_row = dataclasses.replace(table, rows=tuple(r._replace(nbytes=r.block_stride) for r in table.rows))
    with pytest.raises(AssertionError, match="wipes the neighbouring layers"):
        check_zeroer_table(groups, whole_row)


def test_negative_control_layer_major_span_names_its_branch():
    spec = FullAttentionSpec(block_size=2, num_kv_heads=1, head_size=8, kv_outer=True)
    groups = {"fa": allocate_kv_cache(spec, num_blocks=3, num_layers=2)}
    table = zeroer_table(groups)
    short = dataclasses.replace(table, rows=(table.rows[0]._replace(nbytes=16), *table.rows[1:]))
    with pytest.raises(AssertionError, match=r"layer-major 'fa' layer 0: clears 48 bytes .* holds 64"):
        check_zeroer_table(groups, short)


# ---- the kernel on the same geometry, over canaries ----


@given(p=problems())
def test_kernel_clears_exactly_the_segments(p, device):
    groups = build(p, device)
    fill_canaries(groups, p["seed"])
    check_zeroing(groups, p["block_ids"], device)


def test_kernel_on_dsv4_packed_geometry(device):
    groups = dsv4_packed(device=device)
    fill_canaries(groups, seed=7)
    check_zeroing(groups, [0, 57, 99, 57], device)  # first, middle, last (the old zeroer wrote past it), again


def test_one_launch_for_every_group(device, monkeypatch):
    launches = []
    real = kernel._zero_kv_blocks_kernel

    class Counting:
        def __getitem__(self, grid):
            launches.append(grid)
            return real[grid]

    monkeypatch.setattr(kernel, "_zero_kv_blocks_kernel", Counting())
    groups = build(
        dict(
            num_blocks=2,
            mamba=True,
            groups=[
                (FP8DsMLASpec(block_size=2), 2, True),
                (FullAttentionSpec(block_size=2, num_kv_heads=1, head_size=8, kv_outer=True), 2, False),
            ],
        ),
        device,
    )
    fill_canaries(groups, seed=3)
    check_zeroing(groups, [1], device)
    assert len(launches) == 1 and launches[0][1] == 2 + 4  # 2 packed rows + 2 layers x (K, V)


def test_many_chunks_per_segment_and_rows_of_different_lengths(device):
    """Small programs (64 bytes each): a segment spans many chunks, and the shorter rows' extra chunks of the
    shared grid must store nothing."""

    def small_chunks(buffers, table, block_ids):
        kernel.launch_zero_kv_blocks(buffers, table, block_ids, chunk_bytes=64)

    groups = build(
        dict(
            num_blocks=3,
            mamba=False,
            groups=[
                (FP8DsMLASpec(block_size=1), 1, False),  # 656 B segments: 11 chunks
                (MLASpec(block_size=1, kv_lora_rank=8, rope_dim=8), 2, True),
            ],
        ),
        device,
    )  # 32 B segments: 1 chunk
    fill_canaries(groups, seed=17)
    check_zeroing(groups, [2, 0], device, zero=small_chunks)


def test_strided_block_ids(device):
    """block_ids as a slice of a wider tensor (stride 2): the kernel must read the slice, not memory."""

    def strided(buffers, table, block_ids):
        wide = torch.stack([block_ids, torch.zeros_like(block_ids)], dim=1)  # every other id is block 0
        kernel.zero_kv_blocks(buffers, table, wide[:, 0])

    groups = dsv4_packed(num_blocks=4, device=device)
    fill_canaries(groups, seed=11)
    check_zeroing(groups, [3, 1], device, zero=strided)


def test_no_block_ids_is_a_no_op(device):
    groups = dsv4_packed(num_blocks=2, device=device)
    fill_canaries(groups, seed=5)
    check_zeroing(groups, [], device)


def test_out_of_range_block_ids(device):
    groups = {"mla": allocate_kv_cache(FP8DsMLASpec(block_size=1), num_blocks=2, num_layers=2, device=device)}
    fill_canaries(groups, seed=9)
    table = zeroer_table(groups)
    before = table.buffers[0].clone()
    for bad in (2, -1):
        ids = torch.tensor([bad, 0], device=device)
        with pytest.raises(ValueError, match=f"block_ids: {bad} is outside"):
            zero_kv_blocks(list(table.buffers), table.tensor(), ids)
        assert_exact(table.buffers[0], before, "reference refused before writing")
        kernel.zero_kv_blocks(list(table.buffers), table.tensor(), torch.tensor([bad], device=device))
        assert_exact(table.buffers[0], before, f"kernel stores nothing for block id {bad}")


def test_opcheck(device):
    groups = {
        "a": allocate_kv_cache(DeepseekV4Spec(block_size=2), 3, 2, packed=True, device=device),
        "b": allocate_kv_cache(MLASpec(block_size=2, kv_lora_rank=8, rope_dim=8), 3, 1, device=device),
    }
    fill_canaries(groups, seed=11)
    table = zeroer_table(groups)
    torch.library.opcheck(
        torch.ops.touchstone.zero_kv_blocks.default,
        (list(table.buffers), table.tensor(), torch.tensor([2, 0], device=device)),
    )


def _bad_calls(device):
    buf = torch.zeros(64, dtype=torch.uint8, device=device)
    row = torch.tensor([[0, 16, 16, 4]], dtype=torch.int64)  # 4 columns
    good = torch.tensor([[0, 0, 16, 16, 4]], dtype=torch.int64)
    ids = torch.tensor([0], device=device)
    return [
        (([buf.view(torch.int8)], good, ids), TypeError, r"buffers\[0\]"),
        (([buf.view(8, 8)], good, ids), ValueError, r"buffers\[0\]"),
        (([], good, ids), ValueError, "buffers"),
        (([buf], good.int(), ids), TypeError, "table"),
        (([buf], row, ids), ValueError, "table"),
        (([buf], torch.tensor([[1, 0, 16, 16, 4]]), ids), ValueError, "table: row 0 names buffer 1"),
        (([buf], torch.tensor([[0, 0, 16, 16, 5]]), ids), ValueError, r"table: row 0 .* past the 64-byte"),
        (([buf], torch.tensor([[0, 0, 16, 0, 4]]), ids), ValueError, "table: row 0"),
        (([buf], good, ids.float()), TypeError, "block_ids"),
        (([buf], good, ids.view(1, 1)), ValueError, "block_ids"),
    ]


@pytest.mark.parametrize("index", range(10))
def test_bad_arguments_name_the_argument(index, device):
    args, error, message = _bad_calls(device)[index]
    for impl in (zero_kv_blocks, kernel.zero_kv_blocks):
        with pytest.raises(error, match=message):
            impl(*args)


def test_bad_groups_are_refused():
    with pytest.raises(TypeError, match="groups"):
        zeroer_table([MAMBA])
    with pytest.raises(TypeError, match="groups: 'x'"):
        zeroer_table({"x": DeepseekV4Spec(block_size=1)})


# Negative control: the kernel with the page size (the bytes a block clears) as its block stride. Harmless
# where they coincide (layer-major, unpadded), it clears the next layer's bytes in a packed row.
def test_negative_control_kernel_page_size_as_stride(device):
    def faulty(buffers, table, block_ids):
        kernel.launch_zero_kv_blocks(buffers, table, block_ids, fault="page_as_stride")

    groups = dsv4_packed(num_blocks=4, device=device)
    fill_canaries(groups, seed=13)
    with pytest.raises(AssertionError, match="not bit-exact"):
        check_zeroing(groups, [1, 3], device, zero=faulty)
    fill_canaries(groups, seed=13)
    check_zeroing(groups, [1, 3], device)


def test_the_plan_cache_follows_the_table_contents_and_the_buffers():
    """The plan is cached per (table contents, buffer addresses and sizes): the same table and caches plan
    once; a table edited in place, or the same table over other buffers, plans again."""
    buffers = [torch.zeros(4096, dtype=torch.uint8), torch.zeros(4096, dtype=torch.uint8)]
    table = torch.tensor([[0, 0, 512, 256, 8], [1, 128, 512, 256, 8]], dtype=torch.int64)
    first = kernel.plan(buffers, table)
    assert kernel.plan(buffers, table)[1] is first[1]  # a hit: the same words, not recomputed
    table[1, 3] = 128  # the same tensor, edited in place: a planted stale plan would keep 256-byte rows
    assert kernel.plan(buffers, table)[1] != first[1]
    other = [torch.zeros(4096, dtype=torch.uint8), torch.zeros(4096, dtype=torch.uint8)]
    base = kernel.plan(other, table)[0]
    assert any(base is b for b in other)  # the base pointer is one of these buffers, never a cached one
