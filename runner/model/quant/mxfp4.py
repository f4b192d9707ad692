"""MXFP4 W4A16: E2M1 weight codes with one E8M0 scale per 32 weights along K (OCP MX v1.0), activations
unquantized. On CUDA in bf16 the W4A16 GEMM dequantizes the weights in the kernel (Hopper has no FP4 tensor
cores); elsewhere the weights are dequantized exactly (every E2M1 value times a power of two is exact in fp32)
and multiplied in the activation dtype: the fake-quantized model of the MX emulators.

Negative zero: a weight that rounds to zero keeps its sign bit in the E2M1 code (0x8) in some quantizers and
not in others; AMD Quark's checkpoints hold positive zeros only, and vLLM's online-MXFP4 test normalizes -0
before comparing. The load normalizes too: no 0x8 nibble is ever stored (it dequantizes to the same value).

Where apply takes the kernel branch (CUDA, bf16), the weights are stored once, at load, in a kernel layout
(`weight_layout`), and `interchange_weight` gives them back in the interchange layout:
- "fragment" where the packed PTX runs (NVIDIA sm_90+) and N % 16 == 0, K % 64 == 0: `kernels.mxfp4_fragment_layout`
  (words and bf16 scale pairs in mma.sync fragment order), read by the tensor-core GEMV up to 16 rows, the tiled
  W4A16 GEMM above (`kernels.w4a16_mxfp4_fragment_gemv`) and the dequantizer for prefill;
- "prepared" elsewhere on CUDA: `kernels.w4a16_mxfp4_layout` (each word's nibbles reordered so that the packed
  decode yields weights in K order), interchange E8M0 scales."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from reference.formats.nibbles import pack_nibbles, unpack_nibbles
from reference.quant.mxfp4 import MX_BLOCK_SIZE
from runner.model.quant.online import OnlineScheme, zero_pad_columns
from runner.model.quant.scheme import kernels_run_on, uses_kernels

# From this many rows (tokens) on, the weights are dequantized to bf16 by the dequantize kernel and multiplied
# by cuBLAS instead of dequantized inside the W4A16 GEMM: on the H200 (CUDA-graph replays, Llama-3.1-8B's
# gate_up / down / qkv shapes) the W4A16 GEMM is faster up to 64 rows (gate_up 101 us against 141 us) and
# slower from 128 (188 against 147 us; 3789 against 1396 us at 4096 rows, where dequantizing costs 3 % over bf16).
DEQUANTIZE_FROM_ROWS = 128
SCALE_MODE = "floor"  # online default: the OCP spec's rule (torchao's to_mx default); AMD Quark uses "even"


def check_e8m0_scales(name: str, scales: torch.Tensor) -> None:
    """A checkpoint's E8M0 scales: ValueError naming the first 0xFF, E8M0's one NaN (every weight of its block would
    be NaN)."""
    if bool((scales == 0xFF).any()):
        raise ValueError(f"{name}: E8M0 0xFF (NaN) at {[int(i) for i in (scales == 0xFF).nonzero()[0]]}")


def positive_zeros(codes: torch.Tensor) -> torch.Tensor:
    """Packed E2M1 codes with each -0 nibble (0x8) replaced by +0 (0x0)."""
    nibbles = unpack_nibbles(codes)
    return pack_nibbles(torch.where(nibbles == 0x8, torch.zeros_like(nibbles), nibbles))


def quantize_weight(w: torch.Tensor, scale_mode: str = SCALE_MODE) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes with +0 for -0, E8M0 scales) of a contiguous weight [N, K], K a multiple of 32: the quantize kernel
    on CUDA, the reference elsewhere (the same bytes)."""
    if w.is_cuda:
        from kernels.mxfp4 import quantize_mxfp4
    else:
        from reference.quant.mxfp4 import quantize_mxfp4
    codes, scales = quantize_mxfp4(w, scale_mode=scale_mode)
    return positive_zeros(codes), scales


class Mxfp4W4A16(OnlineScheme):
    name = "mxfp4"

    def __init__(self, scale_mode: str = SCALE_MODE, online: bool = True) -> None:
        self.scale_mode = scale_mode  # reference.quant.mx_scale.SCALE_MODES (online only)
        self.online = online

    def create_weights(self, layer) -> None:
        if self.online:
            return super().create_weights(layer)
        n, k = layer.out_features, layer.in_features
        if k % MX_BLOCK_SIZE:
            raise ValueError(f"quantization: mxfp4 needs in_features a multiple of {MX_BLOCK_SIZE}, got {k}")
        codes = layer.new_param((n, k // 2), torch.uint8, exact_dtype=True)
        layer.register_parameter(self.tensor_name("weight"), codes)
        scales = layer.new_param((n, k // MX_BLOCK_SIZE), torch.uint8, exact_dtype=True)
        layer.register_parameter(self.tensor_name("weight_scale"), scales)

    def process_weights_after_loading(self, layer) -> None:
        if self.online:
            return super().process_weights_after_loading(layer)
        names = self.tensor_name("weight"), self.tensor_name("weight_scale")
        codes, scales = (getattr(layer, n).data for n in names)
        for n in names:
            delattr(layer, n)
        check_e8m0_scales(names[1], scales)
        store_weight(layer, positive_zeros(codes), scales)

    def quantize(self, layer, w: torch.Tensor) -> None:
        store_weight(layer, *quantize_weight(zero_pad_columns(w, MX_BLOCK_SIZE).contiguous(), self.scale_mode))

    def apply(self, layer, x: torch.Tensor) -> torch.Tensor:
        x = zero_pad_columns(x, MX_BLOCK_SIZE)
        if uses_kernels(x) and layer.weight_layout == "fragment":
            from kernels.mxfp4_fragment_dequantize import dequantize_mxfp4_fragment
            from kernels.w4a16_mxfp4_fragment_gemv import w4a16_mxfp4_fragment_gemv

            if x.shape[0] >= DEQUANTIZE_FROM_ROWS:
                return F.linear(x, dequantize_mxfp4_fragment(layer.weight_words, layer.weight_pairs))
            return w4a16_mxfp4_fragment_gemv(x, layer.weight_words, layer.weight_pairs)
        if uses_kernels(x):
            from kernels import mxfp4, w4a16_mxfp4_gemm

            prepared = layer.weight_layout == "prepared"
            if x.shape[0] >= DEQUANTIZE_FROM_ROWS:
                dequantize = mxfp4.dequantize_mxfp4_prepared if prepared else mxfp4.dequantize_mxfp4
                return F.linear(x, dequantize(layer.weight_codes, layer.weight_scales, dtype=x.dtype))
            gemm = w4a16_mxfp4_gemm.w4a16_mxfp4_gemm_prepared if prepared else w4a16_mxfp4_gemm.w4a16_mxfp4_gemm
            return gemm(x, layer.weight_codes, layer.weight_scales)
        from reference.quant.mxfp4 import dequantize_mxfp4

        return F.linear(x, dequantize_mxfp4(*interchange_weight(layer), dtype=x.dtype))


def weight_layout(device: torch.device, dtype: torch.dtype, n: int, k: int) -> str:
    """The layout a layer of N x K weights stores on `device` for activations of `dtype` (the module doc)."""
    if not kernels_run_on(device, dtype):
        return "interchange"
    from kernels import mxfp4_fragment_layout as fragment
    from kernels._packed_ptx import packed_ptx

    if packed_ptx(device) and n % fragment.ROWS == 0 and k % fragment.STEP_K == 0:
        return "fragment"
    return "prepared"


def store_weight(layer, codes: torch.Tensor, scales: torch.Tensor) -> None:
    """The layer's final weight, from interchange codes and scales, in its `weight_layout`."""
    layer.weight_layout = weight_layout(codes.device, layer.dtype, codes.shape[0], codes.shape[1] * 2)
    if layer.weight_layout == "fragment":
        from kernels import mxfp4_fragment_layout as fragment

        words, pairs = fragment.prepare(codes, scales)  # a few rows at a time: the load's peak stays low
        layer.register_buffer("weight_words", words)
        layer.register_buffer("weight_pairs", pairs)
        return
    from kernels.w4a16_mxfp4_layout import prepare_codes

    prepared = layer.weight_layout == "prepared"
    layer.register_buffer("weight_codes", prepare_codes(codes) if prepared else codes)
    layer.register_buffer("weight_scales", scales)


def interchange_weight(layer) -> tuple[torch.Tensor, torch.Tensor]:
    """The layer's (codes, scales) in the interchange layout (`reference.quant.mxfp4`'s), whatever it stores."""
    if layer.weight_layout == "fragment":
        from kernels import mxfp4_fragment_layout as fragment

        return fragment.interchange(layer.weight_words, layer.weight_pairs)
    if layer.weight_layout == "interchange":
        return layer.weight_codes, layer.weight_scales
    from kernels.w4a16_mxfp4_layout import interchange_codes

    return interchange_codes(layer.weight_codes), layer.weight_scales
