"""Online quantization at load (`LLM(..., quantization=...)`, runner.model.quant) on the CPU tier.

- The stored bytes are the reference quantizers' on each fused weight (q/k/v and gate/up stacked), K padded
  with zeros where the scheme's block needs it, -0 codes normalized to +0 (MXFP4).
- MXFP4 W4A16 on the CPU is exactly the model whose weights are the dequantized ones (the fake-quant model).
- FP8 per tensor and block FP8 quantize the activations too: their logits are compared with the unquantized
  model by SQNR (the values are in the assertion message).
- A load holds one layer's unquantized weight at a time; a layer is processed once.
- Tensor-parallel shards: quantizing a shard gives the shard of the quantized weight; a split that would cut
  a block is refused.
- MXFP4 bytes equal torchao's `to_mx` (scale mode floor, -0 normalized as here) on every weight of the
  embedded model."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels.tolerances import assert_exact
from reference.quant.fp8 import quantize_fp8, quantize_fp8_blocks
from reference.quant.mxfp4 import dequantize_mxfp4, quantize_mxfp4
from reference.quant.nvfp4 import quantize_nvfp4
from reference.quant.nvfp4_global_scale import DecodeScale, EncodeScale, tensor_amax
from runner.model.layers import Linear
from runner.model.llama import LlamaForCausalLM
from runner.model.quant import ONLINE_SCHEMES, QuantConfig, make_scheme, online_config
from runner.model.quant.mxfp4 import DEQUANTIZE_FROM_ROWS, Mxfp4W4A16, positive_zeros
from runner.model.quant.nvfp4 import KERNEL_ROWS as NVFP4_KERNEL_ROWS
from runner.model.quant.online import zero_pad_columns
from runner.model.quant.tp_shards import check_tp_split
from runner.model.weights import dummy_weights
from suites.runner import quark_oracle
from suites.runner.model_driver import eager_and_graph_tokens, greedy
from suites.runner.tiny_llama import TINY

PROMPTS = [[5, 17, 33, 2, 9, 41], [60, 3, 3, 71]]


def _model(quantization: str | None, weights=None) -> LlamaForCausalLM:
    model = LlamaForCausalLM(TINY, torch.float32, "cpu", online_config(quantization) if quantization else None)
    model.load_weights(weights if weights is not None else dummy_weights(TINY, seed=3))
    return model


def _fused(name: str) -> torch.Tensor:
    """Layer 0's fused weight `name` (qkv_proj / gate_up_proj / o_proj / down_proj) from the dummy weights."""
    w = dict(dummy_weights(TINY, seed=3))
    p = "model.layers.0."
    parts = {
        "qkv_proj": ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"],
        "gate_up_proj": ["mlp.gate_proj", "mlp.up_proj"],
        "o_proj": ["self_attn.o_proj"],
        "down_proj": ["mlp.down_proj"],
    }[name]
    return torch.cat([w[f"{p}{part}.weight"] for part in parts])


def _layers(model):
    layer = model.model.layers[0]
    return {
        "qkv_proj": layer.self_attn.qkv_proj,
        "o_proj": layer.self_attn.o_proj,
        "gate_up_proj": layer.mlp.gate_up_proj,
        "down_proj": layer.mlp.down_proj,
    }


def _sqnr_db(x: torch.Tensor, ref: torch.Tensor) -> float:
    return float(10 * torch.log10(ref.double().pow(2).sum() / (x.double() - ref.double()).pow(2).sum()))


@pytest.mark.parametrize("scheme", ONLINE_SCHEMES)
def test_stored_bytes_are_the_reference_quantizers_on_each_fused_weight(scheme):
    layers = _layers(_model(scheme))
    for name, layer in layers.items():
        w = _fused(name)
        assert "weight" not in dict(layer.named_parameters()), f"{name}: the unquantized weight was kept"
        if scheme == "fp8":
            q, s = quantize_fp8(w, granularity="tensor")
            assert_exact(layer.weight_fp8, q, f"{name} codes")
            assert_exact(layer.weight_scale_cols, s.reshape(1, 1).expand(1, q.shape[0]), f"{name} scale")
        elif scheme == "fp8_block":
            q, s = quantize_fp8_blocks(zero_pad_columns(w, 128))
            assert layer.weight_fp8.shape[1] % 128 == 0 and layer.weight_fp8.shape[1] - w.shape[1] < 128
            assert_exact(layer.weight_fp8, q, f"{name} codes")
            assert_exact(layer.weight_scale_inv, s, f"{name} scales")
        elif scheme == "mxfp4":
            codes, scales = quantize_mxfp4(zero_pad_columns(w, 32), scale_mode="floor")
            assert_exact(layer.weight_codes, positive_zeros(codes), f"{name} codes")
            assert_exact(layer.weight_scales, scales, f"{name} scales")
        else:
            scale = DecodeScale.from_amax(tensor_amax(w))
            codes, scales = quantize_nvfp4(w, scale)
            assert_exact(layer.weight_codes, codes, f"{name} codes")
            assert_exact(layer.weight_scales, scales, f"{name} scales")
            assert_exact(layer.weight_scale_2, scale.value.reshape(()), f"{name} global scale")


def test_mxfp4_model_is_the_model_of_its_dequantized_weights():
    quantized = _model("mxfp4")

    def dequantized():
        for name, tensor in dummy_weights(TINY, seed=3):
            if tensor.dim() == 2 and "layers." in name:
                codes, scales = quantize_mxfp4(tensor, scale_mode="floor")
                tensor = dequantize_mxfp4(codes, scales, dtype=torch.float32)
            yield name, tensor

    # per-shard quantization equals quantizing the fused weight: MX blocks run along K, within a row
    oracle = _model(None, dequantized())
    tokens, logits = greedy(quantized, PROMPTS, 6)
    want_tokens, want_logits = greedy(oracle, PROMPTS, 6)
    assert tokens == want_tokens
    assert_exact(logits, want_logits, "logits")


@pytest.mark.parametrize("scheme", ["fp8", "fp8_block", "nvfp4"])
def test_quantized_logits_stay_close_to_the_unquantized_model(scheme):
    _, logits = greedy(_model(scheme), PROMPTS, 1)
    _, ref = greedy(_model(None), PROMPTS, 1)
    sqnr = _sqnr_db(logits, ref)
    # measured on this random tiny model: 25.2 dB (fp8), 26.4 dB (fp8_block), NVFP4 (W4A16) lower; the
    # planted doubled tile scales of one layer (below): 11.2 dB
    floor = 12 if scheme == "nvfp4" else 20
    assert sqnr > floor, f"{scheme}: logits SQNR {sqnr:.1f} dB vs the unquantized model"


def test_negative_control_a_wrong_scale_is_caught():
    model = _model("fp8_block")
    _, ref = greedy(_model(None), PROMPTS, 1)
    layer = model.model.layers[0].mlp.down_proj
    layer.weight_scale_inv.mul_(2.0)  # planted: the tile scales doubled
    _, logits = greedy(model, PROMPTS, 1)
    assert _sqnr_db(logits, ref) < 20


def test_a_load_holds_one_unquantized_layer_at_a_time():
    model = LlamaForCausalLM(TINY, torch.float32, "cpu", online_config("mxfp4"))
    linears = [m for m in model.modules() if isinstance(m, Linear) and m.scheme.online]
    most = 0

    def watched():
        nonlocal most
        for item in dummy_weights(TINY, seed=3):
            yield item
            most = max(most, sum(m.staging is not None for m in linears))

    model.load_weights(watched())
    assert most == 1 and all(m.staging is None and m.processed for m in linears)
    with pytest.raises(RuntimeError, match="processed already"):
        linears[0].process_weights_after_loading()


def test_negative_zero_is_stored_as_positive_zero():
    w = torch.zeros(2, 64)
    w[0, :4] = torch.tensor([-0.0, -1e-9, 1.0, -6.0])  # -0 and a tiny negative both round to the -0 code
    codes, scales = quantize_mxfp4(w, scale_mode="floor")
    nibbles = torch.stack([codes & 0xF, codes >> 4])
    assert (nibbles == 0x8).any(), "the reference quantizer keeps the sign of zero (else this test is moot)"
    layer = Linear(64, 2, torch.float32, "cpu", Mxfp4W4A16())
    layer.weight_loader(layer.weight, w)
    stored = torch.stack([layer.weight_codes & 0xF, layer.weight_codes >> 4])
    assert not (stored == 0x8).any()
    same = dequantize_mxfp4(layer.weight_codes, layer.weight_scales, dtype=torch.float32)
    assert torch.equal(same, dequantize_mxfp4(codes, scales, dtype=torch.float32))  # -0.0 == 0.0


def test_fused_parts_with_different_schemes_are_refused():
    only_q = QuantConfig("fp8", lambda name: None if name.endswith("q_proj") else "fp8", online=True)
    with pytest.raises(ValueError, match=r"qkv_proj.*different schemes.*q_proj.*unquantized"):
        LlamaForCausalLM(TINY, torch.float32, "cpu", only_q)


def test_the_model_class_packed_mapping_reaches_the_config_as_a_copy():
    """The config a model is built with gets the model class's fused-layer mapping, copied (`for_model`): a
    subclass that fuses more layers has its mapping used (its fused layer's parts with different schemes are
    refused, by name), the base class and the config passed in keep theirs, and no mapping can be changed in
    place."""
    from types import MappingProxyType

    class OutFused(LlamaForCausalLM):  # o_proj made of two checkpoint layers (a mapping entry the base lacks)
        packed_modules_mapping = MappingProxyType(
            {**LlamaForCausalLM.packed_modules_mapping, "o_proj": ("o_proj_a", "o_proj_b")}
        )

    split = QuantConfig("test", lambda name: None if name.endswith("o_proj_b") else "fp8", online=True)
    LlamaForCausalLM(TINY, torch.float32, "cpu", split)  # the base class has no such fused layer
    with pytest.raises(ValueError, match=r"o_proj.*different schemes.*o_proj_a.*fp8.*o_proj_b.*unquantized"):
        OutFused(TINY, torch.float32, "cpu", split)
    model = LlamaForCausalLM(TINY, torch.float32, "cpu", online_config("fp8"))
    assert dict(model.quant.packed_modules_mapping) == dict(LlamaForCausalLM.packed_modules_mapping)
    assert "o_proj" not in LlamaForCausalLM.packed_modules_mapping and not split.packed_modules_mapping
    extended = dataclasses.replace(split, packed_modules_mapping=MappingProxyType({"lm_head": ("lm_head",)}))
    merged = extended.for_model(OutFused.packed_modules_mapping).packed_modules_mapping
    assert (
        set(merged) == {"qkv_proj", "gate_up_proj", "o_proj", "lm_head"}
        and "lm_head" not in OutFused.packed_modules_mapping
    )
    with pytest.raises(TypeError):
        merged["qkv_proj"] = ("q_proj",)


def test_an_unknown_quantization_is_named():
    with pytest.raises(ValueError, match=r"quantization: must be one of \['fp8', 'fp8_block', 'mxfp4', 'nvfp4'\]"):
        online_config("int3")


def _quantized(scheme: str, w: torch.Tensor, whole: torch.Tensor) -> list[torch.Tensor]:
    """`w` (the whole weight or a rank's shard of `whole`) quantized as a rank would: NVFP4 under the whole
    tensor's global scale, which every rank is given."""
    if scheme == "fp8_block":
        return list(quantize_fp8_blocks(w))
    if scheme == "mxfp4":
        return list(quantize_mxfp4(w, scale_mode="floor"))
    if scheme == "nvfp4":
        return list(quantize_nvfp4(w, EncodeScale.from_amax(tensor_amax(whole))))
    raise AssertionError(scheme)


@settings(max_examples=25, deadline=None)
@given(
    scheme=st.sampled_from(["fp8_block", "mxfp4", "nvfp4"]),
    dim=st.sampled_from([0, 1]),
    parts=st.sampled_from([1, 2, 4]),
    blocks=st.integers(1, 3),
    seed=st.integers(0, 2**16),
)
def test_a_quantized_shard_is_the_shard_of_the_quantized_weight(scheme, dim, parts, blocks, seed):
    row_block, col_block = {"fp8_block": (128, 128), "mxfp4": (1, 32), "nvfp4": (1, 16)}[scheme]
    shape = [row_block * 3, col_block * 2]
    shape[dim] = (row_block, col_block)[dim] * blocks * parts
    w = torch.randn(*shape, generator=torch.Generator().manual_seed(seed))
    size = check_tp_split(scheme, tuple(shape), dim, parts)
    whole = _quantized(scheme, w, w)
    for r in range(parts):
        mine = _quantized(scheme, w.narrow(dim, r * size, size).contiguous(), w)
        for got, full in zip(mine, whole, strict=True):
            # codes span the weight's columns (2 a byte for MXFP4), scales one per block along each dim
            per = full.shape[dim] // parts
            assert_exact(got, full.narrow(dim, r * per, per), f"rank {r} of {parts}")


def test_fp8_tensor_shards_need_the_whole_tensors_scale():
    w = torch.randn(8, 64, generator=torch.Generator().manual_seed(1))
    w[0, 0] = 40.0  # the amax sits in shard 0
    q, s = quantize_fp8(w, granularity="tensor")
    own, _ = quantize_fp8(w[4:], granularity="tensor")
    given_, _ = quantize_fp8(w[4:], granularity="tensor", static_scale=s)
    assert_exact(given_, q[4:], "shard quantized with the whole tensor's scale")
    assert not torch.equal(own.view(torch.uint8), q[4:].view(torch.uint8)), "a shard's own scale differs"


def test_nvfp4_shards_need_the_whole_tensors_global_scale():
    w = torch.randn(8, 64, generator=torch.Generator().manual_seed(2))
    w[0, 0] = 40.0  # the amax sits in shard 0
    codes, scales = quantize_nvfp4(w, EncodeScale.from_amax(tensor_amax(w)))
    given_ = quantize_nvfp4(w[4:], EncodeScale.from_amax(tensor_amax(w)))
    own = quantize_nvfp4(w[4:], EncodeScale.from_amax(tensor_amax(w[4:])))
    assert_exact(given_[0], codes[4:], "codes under the whole tensor's global scale")
    assert_exact(given_[1], scales[4:], "block scales under the whole tensor's global scale")
    assert not torch.equal(own[1], scales[4:]), "a shard's own global scale gives other block scales"


@pytest.mark.parametrize(
    ("scheme", "shape", "dim", "parts", "message"),
    [
        ("fp8_block", (256, 384), 1, 2, "spans 128 along dim 1; shards of 192"),
        ("fp8_block", (384, 256), 0, 2, "spans 128 along dim 0; shards of 192"),
        ("mxfp4", (8, 96), 1, 2, "spans 32 along dim 1; shards of 48"),
        ("mxfp4", (8, 96), 1, 5, "does not split into 5 equal shards"),
        ("nvfp4", (8, 96), 1, 4, "spans 16 along dim 1; shards of 24"),
    ],
)
def test_a_split_that_cuts_a_block_is_refused(scheme, shape, dim, parts, message):
    with pytest.raises(ValueError, match=message):
        check_tp_split(scheme, shape, dim, parts)


def test_mxfp4_bytes_equal_torchao_on_every_weight_of_the_embedded_model(smollm2):
    torchao_mx = pytest.importorskip("torchao.prototype.mx_formats.mx_tensor")
    torchao_config = pytest.importorskip("torchao.prototype.mx_formats.config")
    model, _, config = smollm2
    checked = 0
    for name, module in model.named_modules():
        if not isinstance(module, Linear) or module.weight.dim() != 2 or name == "lm_head":
            continue
        w = module.weight.detach()
        layer = Linear(w.shape[1], w.shape[0], torch.float32, "cpu", Mxfp4W4A16())
        layer.weight_loader(layer.weight, w)
        their_scales, their_codes = torchao_mx.to_mx(
            w, torch.float4_e2m1fn_x2, 32, torchao_config.ScaleCalculationMode.FLOOR
        )
        their_codes = positive_zeros(their_codes.view(torch.uint8).reshape(layer.weight_codes.shape))
        assert_exact(layer.weight_scales, their_scales.view(torch.uint8).reshape(layer.weight_scales.shape), name)
        assert_exact(layer.weight_codes, their_codes, name)
        checked += 1
    assert checked == 4 * config.num_hidden_layers


@pytest.mark.gpu_only(reason="runs the quantized GEMM kernels, eagerly and through CUDA graphs")
@pytest.mark.parametrize("scheme", ONLINE_SCHEMES)
def test_gpu_graph_decode_gives_the_eager_tokens_and_tracks_bf16(device, scheme):
    """On the GPU each scheme runs its kernels (torch._scaled_mm, the block-FP8 GEMM, the W4A16 GEMM): decode
    through CUDA graphs gives the tokens of enforce_eager, and the logits stay near the bf16 model's."""
    from suites.runner import tiny_llama

    config = tiny_llama.SMALL_GPU
    model = LlamaForCausalLM(config, torch.bfloat16, device, online_config(scheme))
    model.load_weights(dummy_weights(config, seed=0, device=device, dtype=torch.bfloat16))
    model.eval()
    _, logits = greedy(model, PROMPTS, 1, device=device)
    _, ref = greedy(tiny_llama.model(config, device, torch.bfloat16), PROMPTS, 1, device=device)
    sqnr = _sqnr_db(logits.cpu(), ref.cpu())
    assert sqnr > (10 if scheme.endswith("fp4") else 18), f"{scheme}: logits SQNR {sqnr:.1f} dB vs bf16"
    tokens = eager_and_graph_tokens(model, config, device, PROMPTS * 3)
    assert tokens[True] == tokens[False]


def _forced_kernels(monkeypatch, module) -> None:
    """Take the scheme's kernel branch on CPU tensors (the Triton interpreter runs the kernels on this tier)."""
    monkeypatch.setattr(module, "uses_kernels", lambda x: True)


@pytest.mark.parametrize("rows", [(128, 256), (96, 160)], ids=["on_tiles", "off_tiles"])
def test_fp8_checkpoint_parts_keep_their_scales_on_every_branch(monkeypatch, device, rows):
    """A fused checkpoint layer whose two parts have their own weight scales (one 16x the other), decode rows and
    prefill rows. Where the parts start on 128-row tiles, the decode rows take the block-FP8 GEMM with each tile's
    part's scale: within its lossy row of its mirror on those tiles. Every other branch (row-wise `_scaled_mm`:
    decode rows off the tiles, prefill rows) is the fp32 path's products and scales summed in another order: at
    most one bf16 step (at the larger of the two values) from it plus 2**-8 of the products' magnitudes: a sum
    that cancels shows how it was summed, and Hopper's FP8 tensor cores add each MMA's 32 products aligned to the
    largest of them with about 14 bits (DeepSeek-V3 technical report, arXiv:2412.19437) before `_scaled_mm`
    promotes the partial sums to fp32, so each product may lose up to 2**-13 of the largest of its 32: at most
    2**-8 of their magnitudes summed. Measured on an H100: 2**-14.65 at most (the tighter 2**-12 of an earlier
    version failed on the GPU image only because its torch 2.11 casts codes past 448 to NaN, where 2.13
    saturates: the codes are clamped first). A part's rows under the other part's scale are 16x off, about 15
    times the value, and a value is about 1/16 of the magnitudes here (256 products of random signs). The fp32
    path is the parts' own: each part's rows are its codes times its scale."""
    from kernels.tolerances import assert_lossy, families
    from reference.gemm import block_fp8
    from runner.model.quant import fp8_tensor

    gen = torch.Generator().manual_seed(9)
    shards = dict(zip("ab", rows, strict=True))
    layer = Linear(256, shards, torch.bfloat16, "cpu", make_scheme("fp8_static", online=False))
    parts = []
    for (shard, n), scale in zip(shards.items(), (0.002, 0.032), strict=True):
        codes = (torch.randn(n, 256, generator=gen) * 100).clamp(-448, 448).to(torch.float8_e4m3fn)
        parts.append(codes.to(torch.float32) * scale)
        layer.weight_loader(layer.weight, codes, shard)
        layer.weight_loader(layer.weight_scale, torch.tensor(scale), shard)
        layer.weight_loader(layer.input_scale, torch.tensor(0.02), shard)
    layer.process_weights_after_loading()
    tiled = rows[0] % 128 == 0
    assert hasattr(layer, "weight_scale_tiles") == tiled
    assert_exact(layer.weight_fp8.float() * layer.weight_scale_cols.reshape(-1, 1), torch.cat(parts), "weights")
    for m in (fp8_tensor.DECODE_ROWS, fp8_tensor.DECODE_ROWS + 1):
        x = torch.randn(m, 256, generator=gen).to(torch.bfloat16)
        plain = layer(x)  # the fp32 path
        if device == "cpu":
            with monkeypatch.context() as forced:
                _forced_kernels(forced, fp8_tensor)
                got = layer(x)
        else:
            got = layer.to(device)(x.to(device)).cpu()
            layer.to("cpu")
        if tiled and m <= fp8_tensor.DECODE_ROWS:
            xq, s = fp8_tensor.quantize_e4m3(x, "tensor", layer.input_scale)
            groups = s.reshape(1, 1).expand(m, 2).contiguous()
            per_tile = [0.002] * (rows[0] // 128) + [0.032] * (rows[1] // 128)  # each tile's part's scale
            tiles = torch.tensor(per_tile).reshape(-1, 1).expand(-1, 2).contiguous()
            mirror = block_fp8.block_fp8_gemm_mirror(xq, groups, layer.weight_fp8, tiles, torch.bfloat16)
            ideal = block_fp8.block_fp8_gemm_ideal(xq, groups, layer.weight_fp8, tiles)
            assert_lossy(families.BLOCK_FP8_GEMM, got, mirror, ideal, f"block-FP8 GEMM branch, {m} rows")
        else:
            larger = torch.maximum(got.float().abs(), plain.float().abs())
            step = 2.0 ** (torch.frexp(larger)[1].float() - 8)  # one bf16 step at the larger value
            xq, s = fp8_tensor.quantize_e4m3(x, "tensor", layer.input_scale)
            magnitude = (xq.float().abs() * s) @ torch.cat(parts).abs().T  # where sums cancel, the order shows
            bound = step + magnitude * 2.0**-8
            assert bool(((got.float() - plain.float()).abs() <= bound).all()), f"row-wise branch, {m} rows"


# K padded to the block; MXFP4 from DEQUANTIZE_FROM_ROWS rows on takes the dequantize kernel + bf16 GEMM branch,
# in each weight layout a layer can store (K = 96 is not a whole number of fragment steps: "prepared" on a GPU).
@pytest.mark.parametrize(
    ("scheme", "k", "rows", "layout"),
    [
        ("fp8_block", 320, 3, None),
        ("mxfp4", 96, 3, "prepared"),
        ("mxfp4", 96, DEQUANTIZE_FROM_ROWS, "prepared"),
        ("mxfp4", 128, 1, "fragment"),
        ("mxfp4", 128, 20, "fragment"),
        ("mxfp4", 128, DEQUANTIZE_FROM_ROWS, "fragment"),
        ("nvfp4", 88, 3, None),
        ("nvfp4", 96, NVFP4_KERNEL_ROWS, None),
        ("nvfp4", 96, NVFP4_KERNEL_ROWS + 1, None),
    ],
)
def test_the_kernel_branch_agrees_with_the_references(monkeypatch, device, scheme, k, rows, layout):
    """The GPU path of apply (the block-FP8 GEMM with its activation quantizer; for MXFP4 and NVFP4 the W4A16
    GEMV or GEMM on the layer's layout, or for many rows the dequantize kernel and a bf16 GEMM), run by the
    interpreter on this tier and by the GPU on a GPU tier, against the same layer's mirror and the float64 product
    of its dequantized operands (NVFP4 above KERNEL_ROWS rows: cuBLAS on the weights without the global scale,
    the same arithmetic)."""
    from kernels.tolerances import assert_lossy, families
    from reference.gemm import block_fp8, w4a16_mxfp4, w4a16_nvfp4
    from reference.quant.fp8 import quantize_fp8 as ref_quantize_fp8
    from runner.model.quant import fp8_block, mxfp4, nvfp4

    gen = torch.Generator().manual_seed(7)
    w = torch.randn(48, k, generator=gen).to(torch.bfloat16)
    x = torch.randn(rows, k, generator=gen).to(torch.bfloat16)
    if device == "cpu":
        _forced_kernels(monkeypatch, {"fp8_block": fp8_block, "mxfp4": mxfp4, "nvfp4": nvfp4}[scheme])
    if layout is not None:
        monkeypatch.setattr(mxfp4, "weight_layout", lambda *_: layout)
    layer = Linear(k, 48, torch.bfloat16, device, make_scheme(scheme, online=True))
    layer.weight_loader(layer.weight, w.to(device))
    assert scheme != "mxfp4" or layer.weight_layout == layout
    got = layer(x.to(device)).cpu()
    layer.cpu()
    if scheme == "fp8_block":
        a = zero_pad_columns(x, 128)
        aq, a_s = ref_quantize_fp8(a, granularity="group", group_size=128)
        mirror = block_fp8.block_fp8_gemm_mirror(aq, a_s, layer.weight_fp8, layer.weight_scale_inv, torch.bfloat16)
        ideal = block_fp8.block_fp8_gemm_ideal(aq, a_s, layer.weight_fp8, layer.weight_scale_inv)
        family = families.BLOCK_FP8_GEMM
    elif scheme == "nvfp4":
        a, scale = zero_pad_columns(x, 16), DecodeScale(layer.weight_scale_2)
        mirror = w4a16_nvfp4.w4a16_nvfp4_gemm_mirror(a, layer.weight_codes, layer.weight_scales, scale)
        ideal = w4a16_nvfp4.w4a16_nvfp4_gemm_ideal(a, layer.weight_codes, layer.weight_scales, scale)
        family = families.W4A16_NVFP4_GEMM
    else:
        a = zero_pad_columns(x, 32)
        codes, scales = mxfp4.interchange_weight(layer)
        mirror = w4a16_mxfp4.w4a16_mxfp4_gemm_mirror(a, codes, scales)
        ideal = w4a16_mxfp4.w4a16_mxfp4_gemm_ideal(a, codes, scales)
        family = families.W4A16_MXFP4_GEMM
    assert_lossy(family, got, mirror, ideal, f"{scheme} layer")


def test_nvfp4_rows_round_alike_on_either_side_of_the_crossover(monkeypatch, device):
    """The same rows through the W4A16 GEMM (a batch of KERNEL_ROWS) and through dequantize-then-matmul (one row
    more): both are the fp32 sums of the same exact products times the global scale, rounded once, so they differ
    only where the order of a sum decides a rounding: at most one bf16 step, and almost never. A request's tokens
    then do not depend on which branch its batch, or a CUDA graph's padding, takes (with the weights rounded to
    bf16 times the global scale, 45 % of these outputs differed)."""
    from reference.gemm.w4a16_nvfp4 import block_scaled_weights
    from runner.model.quant import nvfp4

    gen = torch.Generator().manual_seed(8)
    w = torch.randn(64, 96, generator=gen).to(torch.bfloat16)
    x = torch.randn(NVFP4_KERNEL_ROWS + 1, 96, generator=gen).to(torch.bfloat16)
    if device == "cpu":
        _forced_kernels(monkeypatch, nvfp4)
    layer = Linear(96, 64, torch.bfloat16, device, make_scheme("nvfp4", online=True))
    layer.weight_loader(layer.weight, w.to(device))
    kernel = layer(x[:NVFP4_KERNEL_ROWS].to(device)).float().cpu()
    dequantized = layer(x.to(device)).float().cpu()[:NVFP4_KERNEL_ROWS]
    weights = block_scaled_weights(layer.weight_codes.cpu(), layer.weight_scales.cpu())
    magnitude = (x[:NVFP4_KERNEL_ROWS].float().abs() @ weights.abs().T) * layer.weight_scale_2.cpu()
    bound = 2.0 ** (torch.frexp(kernel)[1].float() - 8) + magnitude * 96 * 2.0**-24  # a step, and the sum's order
    assert bool(((dequantized - kernel).abs() <= bound).all())
    assert (dequantized != kernel).float().mean() <= 0.01


@pytest.mark.parametrize("static", [False, True])
def test_fp8_decode_rows_take_the_block_gemm_within_its_row(monkeypatch, device, static):
    """Up to DECODE_ROWS rows (K a multiple of 128) the per-tensor scheme runs the block-FP8 GEMM with its one
    weight scale as every tile's and each token's scale as every group's: within the block-FP8 GEMM's lossy row
    of that arithmetic's mirror, and its result is the scheme's own fp32 path's up to the order of the sum."""
    from kernels.tolerances import assert_lossy, families
    from reference.gemm import block_fp8
    from runner.model.quant import fp8_tensor

    gen = torch.Generator().manual_seed(5)
    layer = Linear(256, 48, torch.bfloat16, "cpu", make_scheme("fp8", online=True))
    layer.weight_loader(layer.weight, torch.randn(48, 256, generator=gen).to(torch.bfloat16))
    if static:
        layer.scheme.static_input = True
        layer.register_buffer("input_scale", torch.tensor([0.02]))
    x = torch.randn(fp8_tensor.DECODE_ROWS, 256, generator=gen).to(torch.bfloat16)
    plain = layer(x)  # the CPU's fp32 path
    if static:
        xq, s = fp8_tensor.quantize_e4m3(x, "tensor", layer.input_scale)
        xs = s.reshape(1, 1).expand(x.shape[0], 1)
    else:
        xq, xs = fp8_tensor.quantize_e4m3(x, "token")
    groups = xs.expand(-1, 2).contiguous()
    mirror = block_fp8.block_fp8_gemm_mirror(xq, groups, layer.weight_fp8, layer.weight_scale_tiles, torch.bfloat16)
    ideal = block_fp8.block_fp8_gemm_ideal(xq, groups, layer.weight_fp8, layer.weight_scale_tiles)
    if device == "cpu":
        _forced_kernels(monkeypatch, fp8_tensor)
        got = layer(x)
    else:
        got = layer.to(device)(x.to(device)).cpu()
    assert_lossy(families.BLOCK_FP8_GEMM, got, mirror, ideal, "fp8 per-tensor layer, decode rows")
    assert_lossy(families.BLOCK_FP8_GEMM, plain, mirror, ideal, "fp8 per-tensor layer, fp32 path")


def test_fp8_scaled_mm_branch_equals_the_fp32_path(monkeypatch, device):
    """torch._scaled_mm with row-wise scales (the CUDA branch) and the fp32 path round an fp32 sum of the same
    exact E4M3 products once: equal on the CPU tier (torch runs _scaled_mm there too), at most one bf16 ulp
    apart on a GPU (cuBLAS sums in another order)."""
    from runner.model.quant import fp8_tensor

    gen = torch.Generator().manual_seed(3)
    layer = Linear(64, 32, torch.bfloat16, "cpu", make_scheme("fp8", online=True))
    layer.weight_loader(layer.weight, torch.randn(32, 64, generator=gen).to(torch.bfloat16))
    x = torch.randn(5, 64, generator=gen).to(torch.bfloat16)
    plain = layer(x)
    if device == "cpu":
        _forced_kernels(monkeypatch, fp8_tensor)
        assert_exact(layer(x), plain, "scaled_mm vs fp32 path")
        return
    got = layer.to(device)(x.to(device)).cpu()
    ulps = (got.view(torch.int16).int() - plain.view(torch.int16).int()).abs().max().item()
    assert ulps <= 1, f"scaled_mm on {device} vs the fp32 path: {ulps} bf16 ulps apart"


def test_mxfp4_even_mode_bytes_equal_amd_quarks_quantizer_on_every_weight_of_the_embedded_model(smollm2):
    """AMD Quark's MX emulation (`fake_quantize_mx`, scale mode "even", its default) against the online MXFP4
    load in the same mode, on every decoder linear weight: the bytes are equal. The scale bytes are Quark's own
    block scales (its `even_round`, as log2 + 127), the codes Quark's values divided by them, encoded, with -0 as
    +0 (the online load's choice); and the dequantized weights are equal."""
    from reference.formats.e2m1 import encode_e2m1
    from reference.formats.nibbles import pack_nibbles

    fake_quantize_mx = quark_oracle.fake_quantize_mx()
    model, _, config = smollm2
    checked = 0
    for name, module in model.named_modules():
        if not isinstance(module, Linear) or name == "lm_head":
            continue
        w = module.weight.detach()
        layer = Linear(w.shape[1], w.shape[0], torch.float32, "cpu", Mxfp4W4A16("even"))
        layer.weight_loader(layer.weight, w)
        ours = dequantize_mxfp4(layer.weight_codes, layer.weight_scales, dtype=torch.float32)
        theirs = fake_quantize_mx(w, axis=-1, block_size=32, scale_calculation_mode="even", mx_element_dtype="fp4")
        assert_exact(ours, theirs, name)
        scale_bytes = quark_oracle.mx_scale_bytes(w)
        assert_exact(layer.weight_scales, scale_bytes, f"{name}: scale bytes")
        steps = torch.exp2(scale_bytes.float() - 127).unsqueeze(-1)
        codes = pack_nibbles(encode_e2m1(theirs.unflatten(-1, (-1, 32)) / steps).flatten(-2))
        assert_exact(layer.weight_codes, positive_zeros(codes), f"{name}: codes")
        checked += 1
    assert checked == 4 * config.num_hidden_layers


@pytest.mark.parametrize(("n", "k"), [(48, 96), (48, 128), (40, 128)])
def test_mxfp4_weights_are_stored_in_the_kernels_layout(device, n, k):
    """A bf16 layer on a GPU keeps its weights in a kernel layout: `kernels.mxfp4_fragment_layout` where the packed
    PTX runs and N % 16 == 0, K % 64 == 0, else the W4A16 GEMM's prepared codes (`kernels.w4a16_mxfp4_layout`); on
    the CPU tier the interchange layout. Whichever, `interchange_weight` gives the quantizer's bytes."""
    from kernels import mxfp4_fragment_layout as fragment
    from kernels._packed_ptx import packed_ptx
    from kernels.w4a16_mxfp4_layout import prepare_codes
    from runner.model.quant.mxfp4 import interchange_weight

    w = torch.randn(n, k, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    layer = Linear(k, n, torch.bfloat16, device, make_scheme("mxfp4", online=True))
    layer.weight_loader(layer.weight, w.to(device))
    codes, scales = quantize_mxfp4(w, scale_mode="floor")
    codes = positive_zeros(codes)
    if device == "cpu":
        want = "interchange"
    else:
        want = "fragment" if packed_ptx(torch.device(device)) and n % 16 == 0 and k % 64 == 0 else "prepared"
    assert layer.weight_layout == want
    if want == "fragment":
        words, pairs = fragment.prepare(codes, scales)
        assert_exact(layer.weight_words.cpu(), words, "stored words")
        assert_exact(layer.weight_pairs.cpu(), pairs, "stored scale pairs")
    else:
        assert_exact(layer.weight_codes.cpu(), prepare_codes(codes) if want == "prepared" else codes, "stored codes")
    got_codes, got_scales = interchange_weight(layer)
    assert_exact(got_codes.cpu(), codes, "interchange codes")
    assert_exact(got_scales.cpu(), scales, "scales")


def test_mxfp4_fragment_layout_stores_the_prepared_quantized_weight(monkeypatch):
    """A layer that stores the fragment layout (forced on this tier) holds `mxfp4_fragment_layout.prepare` of the
    quantizer's bytes (the chunked preparation is the layout suite's)."""
    from kernels import mxfp4_fragment_layout as fragment
    from runner.model.quant import mxfp4

    monkeypatch.setattr(mxfp4, "weight_layout", lambda *_: "fragment")
    w = torch.randn(80, 128, generator=torch.Generator().manual_seed(4))
    layer = Linear(128, 80, torch.float32, "cpu", make_scheme("mxfp4", online=True))
    layer.weight_loader(layer.weight, w)
    words, pairs = fragment.prepare(*mxfp4.quantize_weight(w))
    assert_exact(layer.weight_words, words, "words")
    assert_exact(layer.weight_pairs, pairs, "scale pairs")
