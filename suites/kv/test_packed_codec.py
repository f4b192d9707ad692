"""Byte codecs of the packed FP8 MLA caches (fp8_ds_mla 656 B, DeepSeek-V4 584 B): named bytes, an oracle
written from FlashMLA's quantizer formula, round trips, and tokens written through allocated caches read
back from the raw bytes at the spec's segments."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kernels.tolerances import assert_exact
from reference.kv import packed_codec as codec
from reference.kv.allocate import allocate_kv_cache
from reference.kv.packed_mla import DeepseekV4Spec, FP8DsMLASpec
from suites.quant import mxfp4_cases as cases

FORMATS = {"fp8_ds_mla": (512, 128), "dsv4": (448, 64)}  # NoPE values, tile


def encode(fmt, latent):
    return codec.encode_fp8_ds_mla(latent) if fmt == "fp8_ds_mla" else codec.encode_dsv4(latent)


def decode(fmt, encoded):
    return codec.decode_fp8_ds_mla(encoded) if fmt == "fp8_ds_mla" else codec.decode_dsv4(*encoded)


def parts(fmt, encoded):
    """(codes float8 [..., nope], scales float32 [..., tiles], rope bf16 [..., 64]) read from the bytes."""
    nope = FORMATS[fmt][0]
    if fmt == "fp8_ds_mla":
        data, scales = encoded, encoded[..., 512:528].contiguous().view(torch.float32)
        rope = encoded[..., 528:]
    else:
        data, raw = encoded
        scales = torch.where(raw[..., :7] == 0xFF, math.nan, torch.exp2(raw[..., :7].double() - 127).float())
        rope = data[..., 448:]
    return data[..., :nope].contiguous().view(torch.float8_e4m3fn), scales, rope.contiguous().view(torch.bfloat16)


def oracle(fmt, latent):
    """FlashMLA tests/quant.py's rule, in float64: scale = 2**ceil(log2(max(amax / 448, 1e-4))), q = x / scale."""
    nope, tile = FORMATS[fmt]
    x = latent[..., :nope].double().unflatten(-1, (-1, tile))
    amax = x.abs().amax(-1, keepdim=True)
    scale = torch.exp2(torch.ceil(torch.log2(torch.clamp_min(amax / 448.0, 1e-4))))
    q = (x / scale).flatten(-2).float().to(torch.float8_e4m3fn)
    return q, scale.squeeze(-1).float(), latent[..., nope:]


@st.composite
def latents(draw):
    fmt = draw(st.sampled_from(sorted(FORMATS)))
    lead = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
    positions = st.tuples(st.floats(0, 1, exclude_max=True), st.sampled_from(sorted(cases.SPECIALS)))
    width = FORMATS[fmt][0] + 64
    x = cases.random_blocks(
        (*lead, width),
        torch.float32,
        draw(st.integers(0, 2**31 - 1)),
        draw(st.sampled_from([0.0, 8.0, 30.0])),
        block=64,
    )
    if draw(st.booleans()):  # a tile of zeros or of values under the 1e-4 scale floor
        tile = FORMATS[fmt][1]
        x[..., :tile] *= draw(st.sampled_from([0.0, 2.0**-20]))
    return fmt, cases.inject(x, draw(st.lists(positions, max_size=3))).to(torch.bfloat16)


@given(case=latents())
def test_matches_flashmla_formula_oracle(case):
    fmt, latent = case
    q, scales, rope = parts(fmt, encode(fmt, latent))
    want_q, want_scales, want_rope = oracle(fmt, latent)
    if fmt == "dsv4":  # UE8M0 has no Inf: an Inf scale is stored as NaN
        want_scales = torch.where(want_scales.isinf(), math.nan, want_scales)
    assert_exact(scales, want_scales, f"{fmt} scales")
    assert_exact(q, want_q, f"{fmt} codes")
    assert_exact(rope, want_rope, f"{fmt} RoPE")


@given(case=latents())
def test_decode_is_within_half_an_fp8_step_and_stable(case):
    fmt, latent = case
    latent = torch.nan_to_num(latent, nan=0.0, posinf=1.0, neginf=-1.0)
    back = decode(fmt, encode(fmt, latent))
    _, scales, _ = parts(fmt, encode(fmt, latent))
    nope, tile = FORMATS[fmt]
    x, got = latent[..., :nope].float(), back[..., :nope].float()
    scale = scales.repeat_interleave(tile, dim=-1)
    assert ((got - x).abs() <= torch.maximum(x.abs() * 2.0**-4, scale * 2.0**-10)).all()
    assert_exact(back[..., nope:], latent[..., nope:], "RoPE is copied")
    assert_exact(decode(fmt, encode(fmt, back)), back, "decoding the re-encoded latent")


@pytest.mark.parametrize("fmt", sorted(FORMATS))
@pytest.mark.parametrize("seed", [0, 1])
def test_representable_latent_round_trips_exactly(fmt, seed):
    """Codes times a power of two per tile, each tile holding a +-448: encode then decode gives it back."""
    nope, tile = FORMATS[fmt]
    gen = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 256, (4, nope), generator=gen, dtype=torch.uint8)
    codes = torch.where((codes & 0x7F) == 0x7F, codes ^ 0x01, codes)  # no NaN codes
    signs = torch.randint(0, 2, (4, nope // tile), generator=gen)
    codes[:, ::tile] = torch.tensor([0x7E, 0xFE], dtype=torch.uint8)[signs]  # +-448 in every tile
    exponents = torch.randint(-13, 20, (4, nope // tile), generator=gen).repeat_interleave(tile, dim=-1)
    values = torch.ldexp(codes.view(torch.float8_e4m3fn).float(), exponents.float())
    rope = torch.randn(4, 64, generator=gen)
    latent = torch.cat([values, rope], dim=-1).to(torch.bfloat16)
    assert_exact(decode(fmt, encode(fmt, latent)), latent, f"{fmt} round trip")


def named_latent(nope: int) -> torch.Tensor:
    """Tile 0: 448, 1, -2, -0; tile 1: zeros; tile 2: 3.0; tile 3: a NaN; the rest zeros; RoPE 1.0, -2.0."""
    x = torch.zeros(nope + 64)
    tile = FORMATS["fp8_ds_mla" if nope == 512 else "dsv4"][1]
    x[0:4] = torch.tensor([448.0, 1.0, -2.0, -0.0])
    x[2 * tile], x[3 * tile + 5] = 3.0, math.nan
    x[nope : nope + 2] = torch.tensor([1.0, -2.0])
    return x.to(torch.bfloat16)


def test_fp8_ds_mla_named_bytes():
    e = codec.encode_fp8_ds_mla(named_latent(512))
    assert e.shape == (656,)
    assert e[0:4].tolist() == [0x7E, 0x38, 0xC0, 0x80]  # 448, 1, -2, -0 at scale 1
    assert e[256].item() == 0x7C  # 3.0 / 2**-7 = 384 = 1.5 * 2**8
    assert e[384:512].tolist() == [0x7F] * 128  # the NaN poisons its tile
    assert e[512:528].tolist() == [
        0x00,
        0x00,
        0x80,
        0x3F,  # 1.0
        0x00,
        0x00,
        0x00,
        0x39,  # 2**-13: the 1e-4 floor rounded up
        0x00,
        0x00,
        0x00,
        0x3C,  # 2**-7 >= 3 / 448
        0x00,
        0x00,
        0xC0,
        0x7F,
    ]  # NaN
    assert e[528:532].tolist() == [0x80, 0x3F, 0x00, 0xC0]  # bf16 1.0, -2.0, little-endian


def test_dsv4_named_bytes():
    data, scales = codec.encode_dsv4(named_latent(448))
    assert (data.shape, scales.shape) == ((576,), (8,))
    assert data[0:4].tolist() == [0x7E, 0x38, 0xC0, 0x80]
    assert data[128].item() == 0x7C
    assert data[192:256].tolist() == [0x7F] * 64
    assert scales.tolist() == [127, 114, 120, 0xFF, 114, 114, 114, 0]  # 2**0, 2**-13, 2**-7, NaN, ..., pad 0
    assert data[448:452].tolist() == [0x80, 0x3F, 0x00, 0xC0]


def test_inf_scale_is_nan_in_ue8m0_and_fp32_inf_in_ds_mla():
    x = torch.zeros(576, dtype=torch.bfloat16)
    x[0], x[1] = math.inf, 5.0
    e = codec.encode_fp8_ds_mla(x)
    assert e[512:516].tolist() == [0x00, 0x00, 0x80, 0x7F] and e[1].item() == 0x00  # Inf scale, 5 -> 0
    assert codec.encode_dsv4(x[:512])[1][0].item() == 0xFF


@pytest.mark.parametrize("packed", [False, True], ids=["layer-major", "packed"])
@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_tokens_written_through_views_sit_at_their_segments(fmt, packed):
    spec = FP8DsMLASpec(block_size=3) if fmt == "fp8_ds_mla" else DeepseekV4Spec(block_size=3)
    cache = allocate_kv_cache(spec, num_blocks=2, num_layers=2, packed=packed)
    nope = FORMATS[fmt][0]
    latent = cases.random_blocks((2, 2, 3, nope + 64), torch.float32, seed=5, spread=6.0, block=64).to(torch.bfloat16)
    for layer, views in enumerate(cache.views):
        encoded = encode(fmt, latent[layer])
        if fmt == "fp8_ds_mla":
            views["entries"].copy_(encoded)
        else:
            views["data"].copy_(encoded[0])
            views["scales"].copy_(encoded[1])
    for layer, geometry in enumerate(cache.geometry):
        for block in range(2):
            (page,) = geometry.segments(block)
            for slot in range(3):
                raw = [cache.buffer[page.offset + o : page.offset + o + n] for o, n in spec.token_segments(slot)]
                got = decode(fmt, raw[0] if fmt == "fp8_ds_mla" else tuple(raw))
                assert_exact(got, decode(fmt, encode(fmt, latent[layer, block, slot])), f"{layer=} {block=} {slot=}")


@pytest.mark.parametrize(
    ("call", "error", "name"),
    [
        (lambda: codec.encode_fp8_ds_mla(torch.zeros(576)), TypeError, "latent"),
        (lambda: codec.encode_fp8_ds_mla(torch.zeros(512, dtype=torch.bfloat16)), ValueError, "latent"),
        (lambda: codec.encode_dsv4(torch.zeros(576, dtype=torch.bfloat16)), ValueError, "latent"),
        (lambda: codec.decode_fp8_ds_mla(torch.zeros(656, dtype=torch.int8)), TypeError, "entries"),
        (lambda: codec.decode_fp8_ds_mla(torch.zeros(584, dtype=torch.uint8)), ValueError, "entries"),
        (
            lambda: codec.decode_dsv4(torch.zeros(576, dtype=torch.uint8), torch.zeros(7, dtype=torch.uint8)),
            ValueError,
            "scales",
        ),
        (
            lambda: codec.decode_dsv4(torch.zeros(2, 576, dtype=torch.uint8), torch.zeros(3, 8, dtype=torch.uint8)),
            ValueError,
            "scales",
        ),
    ],
)
def test_bad_arguments_name_the_argument(call, error, name):
    with pytest.raises(error, match=name):
        call()
