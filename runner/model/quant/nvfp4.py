"""NVFP4 W4A16: E2M1 weight codes with one E4M3 scale per 16 weights along K under one fp32 global scale
(`reference.quant.nvfp4`), activations unquantized (compressed-tensors' NVFP4A16; the online scheme). Hopper has
no FP4 tensor cores: a checkpoint that quantizes its activations too runs here with them fake-quantized
(`runner.model.quant.fp4_w4a4`). On CUDA in bf16 the W4A16 GEMM dequantizes the weights in the kernel
(`kernels.w4a16_nvfp4_gemm`: E2M1 times the block scale, exact in bf16, the global scale on the fp32 sums) up to
KERNEL_ROWS rows, and above them in the same arithmetic: the dequantize kernel writes the block-scaled weight (no
global scale) for cuBLAS with fp32 output, scaled and rounded once; on the CPU the weights are dequantized by the
reference and multiplied in the activation dtype.

A fused layer has one global scale (the kernels' contract). A checkpoint quantizes its parts separately (ModelOpt:
`weight_scale_2`, the decode scale, per part); when they differ, gate/up follow the named w1/w3 policy of
`reference.quant.nvfp4_fused_w13` ("raise", "use_w1", "max_requant"), and other fused layers (q/k/v) re-encode
their smaller parts' block scales onto the largest decode scale (max_requant: the FP4 codes stay)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from reference.quant.nvfp4 import NVFP4_BLOCK_SIZE
from reference.quant.nvfp4_fused_w13 import DEFAULT_W13_POLICY, NVFP4Tensor, fuse_w13, rescale_block_scales
from reference.quant.nvfp4_global_scale import DecodeScale, EncodeScale, tensor_amax
from runner.model.quant.online import OnlineScheme, zero_pad_columns
from runner.model.quant.scheme import check_scales, uses_kernels

# The W4A16 GEMM up to this many rows, dequantize-then-matmul above. H200, the kernel's table config over
# dequantize-then-matmul, CUDA-graph replays (`python -m bench.gemm.w4a16_nvfp4_launch_sweep --table-only --m 64 96
# 128 --shapes 6144x4096,28672x4096,4096x14336,8192x8192`: Llama-3.1-8B's projections and the square shape):
# M = 64 1.28-1.88x; M = 96 0.63-1.04x and M = 128 0.60-1.17x (4096x14336 and 6144x4096 lose from 96 rows on).
KERNEL_ROWS = 64


class Nvfp4W4A16(OnlineScheme):
    name = "nvfp4"

    def __init__(self, online: bool = True, w13_policy: str = DEFAULT_W13_POLICY, global_scale: str = "decode") -> None:
        if global_scale not in ("decode", "encode"):
            raise ValueError(f"global_scale: must be 'decode' or 'encode', got {global_scale!r}")
        self.online, self.w13_policy = online, w13_policy
        # The checkpoint's global scale convention (reference.quant.nvfp4_global_scale): ModelOpt's weight_scale_2
        # decodes; compressed-tensors' weight_global_scale encodes
        self.global_scale = global_scale

    def quantize(self, layer, w: torch.Tensor) -> None:
        w = zero_pad_columns(w, NVFP4_BLOCK_SIZE)
        scale = DecodeScale.from_amax(tensor_amax(w))
        if w.is_cuda:
            from kernels.nvfp4 import quantize_nvfp4
        else:
            from reference.quant.nvfp4 import quantize_nvfp4
        codes, scales = quantize_nvfp4(w.contiguous(), scale)
        self._store(layer, codes, scales, scale.value)

    def create_weights(self, layer) -> None:
        if self.online:
            return super().create_weights(layer)
        n, k = layer.out_features, layer.in_features
        if k % NVFP4_BLOCK_SIZE:
            raise ValueError(f"quantization: nvfp4 needs in_features a multiple of {NVFP4_BLOCK_SIZE}, got {k}")
        scales = (n, k // NVFP4_BLOCK_SIZE)
        codes = layer.new_param((n, k // 2), torch.uint8, exact_dtype=True)
        layer.register_parameter(self.tensor_name("weight"), codes)
        layer.register_parameter("weight_scale", layer.new_param(scales, torch.float8_e4m3fn, exact_dtype=True))
        # one global scale per checkpoint part
        global_scales = layer.new_param((len(layer.shard_sizes),), torch.float32, per_shard=True)
        layer.register_parameter(self.tensor_name("weight_scale_2"), global_scales)

    def process_weights_after_loading(self, layer) -> None:
        if self.online:
            return super().process_weights_after_loading(layer)
        names = [self.tensor_name("weight"), "weight_scale", self.tensor_name("weight_scale_2")]
        codes, scales, global_scales = (getattr(layer, n).data for n in names)
        scales = scales.view(torch.uint8)
        for name in names:
            delattr(layer, name)
        check_scales(names[2], global_scales)
        if self.global_scale == "encode":  # fp32(1 / s_enc) per part: EncodeScale.to_decode
            decode = torch.stack([EncodeScale(g).to_decode().value for g in global_scales])
        else:
            decode = global_scales
        if bool((decode == decode[0]).all()):
            return self._store(layer, codes, scales, decode[0])
        rows = list(layer.shard_sizes.values())
        if list(layer.shard_sizes) == [0, 1]:  # gate / up: the named w1/w3 policy
            halves = [
                NVFP4Tensor(c, s, DecodeScale(d))
                for c, s, d in zip(codes.split(rows), scales.split(rows), decode, strict=True)
            ]
            fused = fuse_w13(*halves, policy=self.w13_policy)
            return self._store(layer, fused.codes, fused.scales, fused.global_scale.value)
        top = decode.max()
        parts = [rescale_block_scales(s, d / top) for s, d in zip(scales.split(rows), decode, strict=True)]
        self._store(layer, codes, torch.cat(parts), top)

    def _store(self, layer, codes: torch.Tensor, scales: torch.Tensor, decode: torch.Tensor) -> None:
        layer.register_buffer("weight_codes", codes.contiguous())
        layer.register_buffer("weight_scales", scales.contiguous())
        layer.register_buffer("weight_scale_2", torch.as_tensor(decode, dtype=torch.float32).reshape(()))

    def apply(self, layer, x: torch.Tensor) -> torch.Tensor:
        scale = DecodeScale(layer.weight_scale_2)
        if uses_kernels(x) and x.shape[0] <= KERNEL_ROWS:
            from kernels.w4a16_nvfp4_gemm import w4a16_nvfp4_gemm

            x = zero_pad_columns(x, NVFP4_BLOCK_SIZE)
            return w4a16_nvfp4_gemm(x, layer.weight_codes, layer.weight_scales, scale)
        if uses_kernels(x):
            return _dequantize_then_matmul(layer, x)
        from reference.quant.nvfp4 import dequantize_nvfp4

        w = dequantize_nvfp4(layer.weight_codes, layer.weight_scales, scale, dtype=x.dtype)
        return F.linear(x, w[:, : x.shape[1]])


def _dequantize_then_matmul(layer, x: torch.Tensor) -> torch.Tensor:
    """The kernel branch above KERNEL_ROWS in the W4A16 GEMM's own arithmetic (the mirror's): the weights
    dequantized without the global scale (E2M1 times E4M3: at most 6 significant bits in 2**-10 .. 2688, exact in
    bf16, fp16 and fp32), fp32 sums of the exact products, times the global scale in fp32, one rounding. Rounding
    the weights times the global scale to bf16 instead put 45 % of a layer's outputs off the kernel's for the same
    rows (suites/runner/test_quant_online.py), so a request's logits depended on whether its batch, or a CUDA
    graph's padding, crossed KERNEL_ROWS."""
    from kernels.nvfp4 import dequantize_nvfp4

    half = x.is_cuda and x.dtype in (torch.bfloat16, torch.float16)  # cuBLAS: fp32 accumulation and output
    unit = DecodeScale(torch.ones((), dtype=torch.float32, device=x.device))
    w = dequantize_nvfp4(layer.weight_codes, layer.weight_scales, unit, dtype=x.dtype if half else torch.float32)
    w = w[:, : x.shape[1]]
    # fp32 activations, or the interpreter's CPU tensors: the same exact products summed in fp32
    sums = torch.mm(x, w.T, out_dtype=torch.float32) if half else torch.mm(x.float(), w.T)
    return (sums * layer.weight_scale_2).to(x.dtype)
