"""KV store: the Triton kernels against `reference.kv.store`, bit for bit on the whole cache buffer (written
slots, and every byte that must stay as it was: other slots, other layers, padding), over drawn block sizes,
head counts, head sizes, NHD/HND, K/V-outermost and packed multi-layer buffers, dtypes and ragged slot
mappings with padding slots; named bytes; tokens read back at the spec's segments; a negative control."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kernels.tolerances import assert_exact
from reference.kv import store as ref
from reference.kv.allocate import KVCache, allocate_kv_cache
from reference.kv.attention import FullAttentionSpec
from reference.kv.packed_codec import encode_dsv4, encode_fp8_ds_mla
from reference.kv.packed_mla import DeepseekV4Spec, FP8DsMLASpec
from suites.quant import mxfp4_cases as cases

kernel = pytest.importorskip("kernels.kv_store")
CANARY = 0xA5  # every byte of a fresh cache: a store may change only the bytes of the slots it writes
SCALE_CANARY = -3.0
FP8 = torch.float8_e4m3fn
SPECIALS = sorted(cases.SPECIALS)
MLA_WIDTH = {"fp8_ds_mla": 576, "dsv4": 512}


def slot_mapping(num_slots: int, n_valid: int, n_pad: int, seed: int) -> torch.Tensor:
    """n_valid distinct slots in random order with n_pad padding slots (-1) spread among them."""
    gen = torch.Generator().manual_seed(seed)
    slots = torch.randperm(num_slots, generator=gen)[:n_valid]
    mapping = torch.cat([slots, torch.full((n_pad,), -1, dtype=torch.int64)])
    return mapping[torch.randperm(mapping.numel(), generator=gen)]


def canonical_nans(cache: KVCache) -> None:
    """NaN payloads may differ (tolerance policy: GPUs canonicalise NaN): rewrite every NaN of the cache's fp8
    codes to 0x7F and of its fp32 scales to 0x7FC00000, in place, before comparing bytes."""
    for views in cache.views:
        codes = [v for v in views.values() if v.dtype == FP8]
        fp32 = []
        if "entries" in views:
            codes.append(views["entries"][..., :512])
            fp32.append(views["entries"][..., 512:528].view(torch.int32))
        if "data" in views:
            codes.append(views["data"][..., :448])
        for c in codes:
            c = c.view(torch.uint8)
            c[(c & 0x7F) == 0x7F] = 0x7F
        for f in fp32:
            f[(f & 0x7FFFFFFF) > 0x7F800000] = 0x7FC00000


def assert_same_cache(got: KVCache, want: KVCache, what: str) -> None:
    canonical_nans(got)
    canonical_nans(want)
    assert_exact(got.buffer, want.buffer, f"{what}: cache bytes")


# ---- full attention ----
@st.composite
def attention_problems(draw):
    dtype = draw(st.sampled_from([torch.bfloat16, torch.float16, torch.float32, FP8]))
    kv_outer = draw(st.booleans())
    spec = FullAttentionSpec(
        block_size=draw(st.sampled_from([1, 2, 3, 4, 8, 16])),
        num_kv_heads=draw(st.integers(1, 5)),
        head_size=draw(st.sampled_from([1, 8, 24, 64])),
        head_size_v=draw(st.sampled_from([None, 16, 40])),
        dtype=dtype,
        layout=draw(st.sampled_from(["NHD", "HND"])),
        kv_outer=kv_outer,
    )
    num_blocks, num_layers = draw(st.integers(1, 4)), draw(st.integers(1, 2))
    num_slots = num_blocks * spec.block_size
    positions = st.tuples(st.floats(0, 1, exclude_max=True), st.sampled_from(SPECIALS))
    return dict(
        spec=spec,
        num_blocks=num_blocks,
        num_layers=num_layers,
        layer=draw(st.integers(0, num_layers - 1)),
        packed=not kv_outer and draw(st.booleans()),
        seed=draw(st.integers(0, 2**31 - 1)),
        n_valid=draw(st.integers(0, min(num_slots, 8))),
        n_pad=draw(st.integers(0, 3)),
        input_dtype=draw(st.sampled_from([torch.bfloat16, torch.float16, torch.float32])) if dtype == FP8 else dtype,
        spread=draw(st.sampled_from([0.0, 6.0, 20.0])),
        strided=draw(st.booleans()),
        specials=draw(st.lists(positions, max_size=3)),
    )


def attention_inputs(p: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    spec = p["spec"]
    mapping = slot_mapping(p["num_blocks"] * spec.block_size, p["n_valid"], p["n_pad"], p["seed"])
    n, heads, extra = mapping.numel(), spec.num_kv_heads, 3 if p["strided"] else 0
    tensors = []
    for i, size in enumerate((spec.head_size, spec.v_head_size)):
        x = cases.random_blocks((n, heads, size + extra), torch.float32, p["seed"] + i, p["spread"], block=size + extra)
        x = cases.inject(x, p["specials"]) if x.numel() else x
        tensors.append(x.to(p["input_dtype"])[..., :size])  # strided: a slice, as of a fused QKV output
    if p["strided"]:  # a slice of a wider metadata tensor: the kernel must not assume stride 1
        mapping = torch.stack([mapping, torch.full_like(mapping, 10**6)], dim=1)[:, 0]
    return tensors[0], tensors[1], mapping


def scale_shape(spec: FullAttentionSpec, num_blocks: int) -> tuple[int, int, int]:
    if spec.layout == "NHD":
        return (num_blocks, spec.block_size, spec.num_kv_heads)
    return (num_blocks, spec.num_kv_heads, spec.block_size)


def run_store_kv(impl, p, key, value, mapping, device):
    """A fresh canary cache (and canary scales) on `device`, stored into by `impl`; returns (cache, scales)."""
    spec = p["spec"]
    cache = allocate_kv_cache(spec, p["num_blocks"], p["num_layers"], packed=p["packed"], device=device, fill=CANARY)
    scales = {}
    if spec.dtype == FP8:
        scales = {
            name: torch.full(scale_shape(spec, p["num_blocks"]), SCALE_CANARY, device=device)
            for name in ("k_scale", "v_scale")
        }
    views = cache.views[p["layer"]]
    impl(key.to(device), value.to(device), views["k"], views["v"], mapping.to(device), layout=spec.layout, **scales)
    return cache, scales


def check_store_kv(p: dict, device: str, impl=kernel.store_kv) -> None:
    key, value, mapping = attention_inputs(p)
    want, want_scales = run_store_kv(ref.store_kv, p, key, value, mapping, "cpu")
    got, got_scales = run_store_kv(impl, p, key, value, mapping, device)
    for name, s in want_scales.items():
        assert_exact(got_scales[name], s, name)
    assert_same_cache(got, want, f"{p['spec']}")


@given(p=attention_problems())
def test_store_kv_matches_reference(p, device):
    check_store_kv(p, device)


def named_problem(dtype, layout="NHD", **overrides):
    spec = FullAttentionSpec(block_size=4, num_kv_heads=2, head_size=8, dtype=dtype, layout=layout)
    return dict(spec=spec, num_blocks=3, num_layers=1, layer=0, packed=False) | overrides


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_bf16_named_slots(layout, device):
    """Slot 5 is block 1 position 1, slot 0 block 0 position 0; the padding token lands nowhere. Bits are
    copied: -0.0, a subnormal, NaNs with payloads."""
    p = named_problem(torch.bfloat16, layout)
    key_bits = [0x3F80, -0x4000, -0x8000, 0x7FC1]  # 1, -2, -0, NaN with a payload
    value_bits = [0x0001, -0x007F, 0x7F80, 0x0000]  # smallest subnormal, -NaN with a payload, Inf, 0
    key = torch.tensor(key_bits, dtype=torch.int16).repeat(3, 2, 2).view(torch.bfloat16)
    value = torch.tensor(value_bits, dtype=torch.int16).repeat(3, 2, 2).view(torch.bfloat16)
    mapping = torch.tensor([5, -1, 0])
    for impl, dev in ((ref.store_kv, "cpu"), (kernel.store_kv, device)):
        cache, _ = run_store_kv(impl, p, key, value, mapping, dev)
        k, v = (t.cpu() for t in cache.views[0].values())
        if layout == "HND":
            k, v = k.transpose(1, 2), v.transpose(1, 2)
        assert_exact(k[1, 1], key[0], "token 0 at block 1 position 1")
        assert_exact(v[0, 0], value[2], "token 2 at block 0 position 0")
        assert k[1, 1].view(torch.int16)[0, :4].tolist() == key_bits
        assert v[0, 0].view(torch.int16)[1, 4:].tolist() == value_bits
        written = (cache.buffer.cpu() != CANARY).sum().item()
        assert written == 2 * 2 * 2 * 8 * 2, f"{written} bytes changed; two tokens of K and V are 128 bytes"


def test_fp8_named_codes_and_scales(device):
    """Head 0: amax 448 gives scale 1 and codes 448, 1, -2, -0 = 7E 38 C0 80. Head 1: amax 13 gives scale
    fl(13/448), and 13 * fl(1/scale) = 448.00003, an ulp above 448: 448 (7E, FE). An all-zero head (value) has the
    eps scale fl(1e-10/448) and codes 0."""
    p = named_problem(FP8)
    key = torch.zeros(1, 2, 8)
    key[0, 0, :4] = torch.tensor([448.0, 1.0, -2.0, -0.0])
    key[0, 1, :2] = torch.tensor([13.0, -13.0])
    value = torch.zeros(1, 2, 8)
    mapping = torch.tensor([6])
    for impl, dev in ((ref.store_kv, "cpu"), (kernel.store_kv, device)):
        cache, scales = run_store_kv(impl, p, key, value, mapping, dev)
        k, v = (t.cpu().view(torch.uint8) for t in cache.views[0].values())
        assert k[1, 2, 0, :4].tolist() == [0x7E, 0x38, 0xC0, 0x80] and k[1, 2, 0, 4:].tolist() == [0] * 4
        assert k[1, 2, 1, :2].tolist() == [0x7E, 0xFE]
        assert v[1, 2].tolist() == [[0] * 8] * 2
        k_scale, v_scale = scales["k_scale"].cpu(), scales["v_scale"].cpu()
        assert k_scale[1, 2].tolist() == [1.0, float(np.float32(13.0) / np.float32(448.0))]
        assert v_scale[1, 2].tolist() == [float(np.float32(1e-10) / np.float32(448.0))] * 2
        assert (k_scale[0] == SCALE_CANARY).all() and (k_scale[1, :2] == SCALE_CANARY).all()


def test_kernel_skips_slots_past_the_cache(device):
    """The reference refuses them; the kernel (which never reads slot values on the host) writes nothing."""
    p = named_problem(torch.float16)
    key = torch.ones(2, 2, 8, dtype=torch.float16)
    mapping = torch.tensor([12, 13])  # 3 blocks of 4: slots 0..11
    with pytest.raises(ValueError, match="slot_mapping"):
        run_store_kv(ref.store_kv, p, key, key, mapping, "cpu")
    cache, _ = run_store_kv(kernel.store_kv, p, key, key, mapping, device)
    assert (cache.buffer.cpu() == CANARY).all()


# ---- packed MLA ----
@st.composite
def mla_problems(draw):
    fmt = draw(st.sampled_from(sorted(MLA_WIDTH)))
    block_size = draw(st.integers(1, 5))
    spec = FP8DsMLASpec(block_size=block_size) if fmt == "fp8_ds_mla" else DeepseekV4Spec(block_size=block_size)
    num_blocks, num_layers = draw(st.integers(1, 3)), draw(st.integers(1, 2))
    positions = st.tuples(st.floats(0, 1, exclude_max=True), st.sampled_from(SPECIALS))
    return dict(
        fmt=fmt,
        spec=spec,
        num_blocks=num_blocks,
        num_layers=num_layers,
        layer=draw(st.integers(0, num_layers - 1)),
        packed=draw(st.booleans()),
        seed=draw(st.integers(0, 2**31 - 1)),
        n_valid=draw(st.integers(0, min(num_blocks * block_size, 5))),
        n_pad=draw(st.integers(0, 2)),
        spread=draw(st.sampled_from([0.0, 8.0, 30.0])),
        tiny_tile=draw(st.sampled_from([None, 0.0, 2.0**-20])),
        strided=draw(st.booleans()),
        specials=draw(st.lists(positions, max_size=3)),
    )


def mla_inputs(p: dict) -> tuple[torch.Tensor, torch.Tensor]:
    mapping = slot_mapping(p["num_blocks"] * p["spec"].block_size, p["n_valid"], p["n_pad"], p["seed"])
    width, extra = MLA_WIDTH[p["fmt"]], 64 if p["strided"] else 0
    x = cases.random_blocks((mapping.numel(), width + extra), torch.float32, p["seed"], p["spread"], block=64)
    if p["tiny_tile"] is not None:  # a tile of zeros, or of values under the 1e-4 scale floor
        x[:, :64] *= p["tiny_tile"]
    x = cases.inject(x, p["specials"]) if x.numel() else x
    return x.to(torch.bfloat16)[:, :width], mapping


def store_mla(impl_module, fmt, latent, views, mapping):
    if fmt == "fp8_ds_mla":
        impl_module.store_fp8_ds_mla(latent, views["entries"], mapping)
    else:
        impl_module.store_dsv4(latent, views["data"], views["scales"], mapping)


def run_store_mla(impl_module, p, latent, mapping, device) -> KVCache:
    cache = allocate_kv_cache(
        p["spec"], p["num_blocks"], p["num_layers"], packed=p["packed"], device=device, fill=CANARY
    )
    store_mla(impl_module, p["fmt"], latent.to(device), cache.views[p["layer"]], mapping.to(device))
    return cache


def check_store_mla(p: dict, device: str, impl_module=kernel) -> None:
    latent, mapping = mla_inputs(p)
    want = run_store_mla(ref, p, latent, mapping, "cpu")
    got = run_store_mla(impl_module, p, latent, mapping, device)
    assert_same_cache(got, want, f"{p['fmt']} {p['spec']}")


@given(p=mla_problems())
def test_store_packed_mla_matches_reference(p, device):
    check_store_mla(p, device)


@pytest.mark.parametrize("packed", [False, True], ids=["layer-major", "packed"])
@pytest.mark.parametrize("fmt", sorted(MLA_WIDTH))
def test_packed_tokens_sit_at_the_spec_segments(fmt, packed, device):
    """Read each stored token back from the raw buffer at the layer's block segment + the spec's token
    segments (reference.kv.packed_mla), and compare with the codec's bytes; every other byte is the canary."""
    spec = FP8DsMLASpec(block_size=3) if fmt == "fp8_ds_mla" else DeepseekV4Spec(block_size=3)
    p = dict(fmt=fmt, spec=spec, num_blocks=2, num_layers=2, layer=1, packed=packed)
    latent = cases.random_blocks((3, MLA_WIDTH[fmt]), torch.float32, seed=7, spread=6.0, block=64).to(torch.bfloat16)
    mapping = torch.tensor([4, 0, -1])
    cache = run_store_mla(kernel, p, latent[:, : MLA_WIDTH[fmt]], mapping, device)
    buffer = cache.buffer.cpu()
    touched = torch.zeros(buffer.numel(), dtype=torch.bool)
    for token, slot in ((0, 4), (1, 0)):
        (page,) = cache.geometry[1].segments(slot // 3)
        segments = spec.token_segments(slot % 3)
        want = encode_fp8_ds_mla(latent[token]) if fmt == "fp8_ds_mla" else torch.cat(encode_dsv4(latent[token]))
        got = torch.cat([buffer[page.offset + o : page.offset + o + n] for o, n in segments])
        assert_exact(got, want, f"token {token} at slot {slot}")
        for o, n in segments:
            touched[page.offset + o : page.offset + o + n] = True
    assert (buffer[~touched] == CANARY).all(), "bytes outside the two tokens' segments changed"


# ---- operator contract, arguments ----
def test_opcheck(device):
    # A bf16 cache: opcheck's schema test compares float8 tensors with a multiply torch lacks for them.
    spec = FullAttentionSpec(block_size=4, num_kv_heads=2, head_size=8, dtype=torch.bfloat16, layout="HND")
    views = allocate_kv_cache(spec, 2, device=device).views[0]
    key = torch.randn(3, 2, 8, device=device).to(torch.bfloat16)
    mapping = torch.tensor([1, -1, 6], device=device)
    torch.library.opcheck(
        torch.ops.touchstone.store_kv.default, (key, key, views["k"], views["v"], mapping, "HND", None, None)
    )
    latent = torch.randn(3, 576, device=device).to(torch.bfloat16)
    entries = torch.zeros(2, 4, 656, dtype=torch.uint8, device=device)
    torch.library.opcheck(torch.ops.touchstone.store_fp8_ds_mla.default, (latent, entries, mapping))
    data, rows = (torch.zeros(2, 4, n, dtype=torch.uint8, device=device) for n in (576, 8))
    torch.library.opcheck(torch.ops.touchstone.store_dsv4.default, (latent[:, :512], data, rows, mapping))


def _bad_store_kv(**changes):
    spec = FullAttentionSpec(block_size=4, num_kv_heads=2, head_size=8, dtype=FP8)
    views = allocate_kv_cache(spec, 2).views[0]
    args = dict(
        key=torch.zeros(3, 2, 8),
        value=torch.zeros(3, 2, 8),
        k_cache=views["k"],
        v_cache=views["v"],
        slot_mapping=torch.zeros(3, dtype=torch.int64),
        layout="NHD",
        k_scale=torch.zeros(2, 4, 2),
        v_scale=torch.zeros(2, 4, 2),
    )
    return args | changes


BAD_STORE_KV = [
    (dict(layout="NDH"), ValueError, "layout"),
    (dict(key=torch.zeros(3, 2, 7)), ValueError, "key"),
    (dict(value=torch.zeros(3, 3, 8)), ValueError, "value"),
    (dict(key=torch.zeros(3, 2, 8, dtype=torch.int32)), TypeError, "key"),
    (dict(slot_mapping=torch.zeros(3, dtype=torch.int32)), TypeError, "slot_mapping"),
    (dict(slot_mapping=torch.zeros(4, dtype=torch.int64)), ValueError, "slot_mapping"),
    (dict(k_scale=None), ValueError, "k_scale"),
    (dict(v_scale=torch.zeros(2, 2, 4)), ValueError, "v_scale"),
    (dict(k_cache=torch.zeros(2, 4, 2, 8, dtype=torch.bfloat16)), TypeError, "v_cache"),
    # Dense with head_size not innermost: `.to(device)` keeps these strides (a sliced, non-dense tensor would
    # arrive contiguous on the GPU, and the test would check nothing there).
    (dict(k_cache=torch.zeros(2, 4, 8, 2, dtype=FP8).transpose(-1, -2)), ValueError, "k_cache"),
]


@pytest.mark.parametrize(
    ("changes", "error", "name"), BAD_STORE_KV, ids=[f"{c[2]}-{i}" for i, c in enumerate(BAD_STORE_KV)]
)
def test_store_kv_bad_arguments_name_the_argument(changes, error, name, device):
    for impl, dev in ((ref.store_kv, "cpu"), (kernel.store_kv, device)):
        args = {k: v.to(dev) if isinstance(v, torch.Tensor) else v for k, v in _bad_store_kv(**changes).items()}
        with pytest.raises(error, match=name):
            impl(
                args.pop("key"),
                args.pop("value"),
                args.pop("k_cache"),
                args.pop("v_cache"),
                args.pop("slot_mapping"),
                **args,
            )


def test_copy_cache_refuses_scales_and_other_dtypes(device):
    spec = FullAttentionSpec(block_size=4, num_kv_heads=2, head_size=8, dtype=torch.bfloat16)
    views = allocate_kv_cache(spec, 2, device=device).views[0]
    key, mapping = torch.zeros(1, 2, 8, device=device), torch.zeros(1, dtype=torch.int64, device=device)
    with pytest.raises(TypeError, match="key"):
        kernel.store_kv(key, key.bfloat16(), views["k"], views["v"], mapping)
    with pytest.raises(ValueError, match="k_scale"):
        kernel.store_kv(
            key.bfloat16(), key.bfloat16(), views["k"], views["v"], mapping, k_scale=torch.zeros(2, 4, 2, device=device)
        )


@pytest.mark.parametrize(
    ("call", "error", "name"),
    [
        (
            lambda m: m.store_fp8_ds_mla(
                torch.zeros(2, 576), torch.zeros(1, 4, 656, dtype=torch.uint8), torch.zeros(2, dtype=torch.int64)
            ),
            TypeError,
            "latent",
        ),
        (
            lambda m: m.store_fp8_ds_mla(
                torch.zeros(2, 512, dtype=torch.bfloat16),
                torch.zeros(1, 4, 656, dtype=torch.uint8),
                torch.zeros(2, dtype=torch.int64),
            ),
            ValueError,
            "latent",
        ),
        (
            lambda m: m.store_fp8_ds_mla(
                torch.zeros(2, 576, dtype=torch.bfloat16),
                torch.zeros(1, 4, 584, dtype=torch.uint8),
                torch.zeros(2, dtype=torch.int64),
            ),
            ValueError,
            "entries",
        ),
        (
            lambda m: m.store_dsv4(
                torch.zeros(2, 512, dtype=torch.bfloat16),
                torch.zeros(1, 4, 576, dtype=torch.uint8),
                torch.zeros(2, 4, 8, dtype=torch.uint8),
                torch.zeros(2, dtype=torch.int64),
            ),
            ValueError,
            "scales",
        ),
        (
            lambda m: m.store_dsv4(
                torch.zeros(2, 512, dtype=torch.bfloat16),
                torch.zeros(1, 4, 576, dtype=torch.int8),
                torch.zeros(1, 4, 8, dtype=torch.uint8),
                torch.zeros(2, dtype=torch.int64),
            ),
            TypeError,
            "data",
        ),
    ],
    ids=["latent-dtype", "latent-width", "entries-width", "scales-blocks", "data-dtype"],
)
def test_packed_bad_arguments_name_the_argument(call, error, name):
    for module in (ref, kernel):
        with pytest.raises(error, match=name):
            call(module)


# ---- negative control: the planted slot-mapping off-by-one must be caught ----
class Faulty:
    """The kernels with a planted bug, behind the wrappers' signatures."""

    def __init__(self, fault: str):
        self.fault = fault

    def store_kv(self, key, value, k_cache, v_cache, slot_mapping, *, layout="NHD", k_scale=None, v_scale=None):
        kernel.launch_store_kv(key, value, k_cache, v_cache, slot_mapping, layout, k_scale, v_scale, fault=self.fault)

    def store_fp8_ds_mla(self, latent, entries, slot_mapping):
        kernel.launch_store_fp8_ds_mla(latent, entries, slot_mapping, fault=self.fault)

    def store_dsv4(self, latent, data, scales, slot_mapping):
        kernel.launch_store_dsv4(latent, data, scales, slot_mapping, fault=self.fault)


def test_negative_control_slot_zero_taken_for_padding(device):
    """Every slot of a one-block cache is written, slot 0 among them: the faulty kernel leaves it untouched."""
    attention = dict(
        spec=FullAttentionSpec(block_size=4, num_kv_heads=2, head_size=8, dtype=FP8, layout="HND"),
        num_blocks=1,
        num_layers=2,
        layer=1,
        packed=True,
        seed=1,
        n_valid=4,
        n_pad=1,
        input_dtype=torch.bfloat16,
        spread=4.0,
        strided=False,
        specials=[],
    )
    mla = dict(
        fmt="dsv4",
        spec=DeepseekV4Spec(block_size=2),
        num_blocks=1,
        num_layers=1,
        layer=0,
        packed=False,
        seed=2,
        n_valid=2,
        n_pad=1,
        spread=4.0,
        tiny_tile=None,
        strided=False,
        specials=[],
    )
    faulty, sound = Faulty("slot_zero_is_padding"), Faulty("none")
    with pytest.raises(AssertionError, match="not bit-exact"):
        check_store_kv(attention, device, faulty.store_kv)
    with pytest.raises(AssertionError, match="not bit-exact"):
        check_store_mla(mla, device, faulty)
    check_store_kv(attention, device, sound.store_kv)
    check_store_mla(mla, device, sound)
