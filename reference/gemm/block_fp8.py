"""Block-FP8 W8A8 GEMM (DeepSeek-V3): 1x128 activation groups x 128x128 weight blocks, "NT" layout.

Contract (the kernel `kernels.block_fp8_gemm` takes the same arguments):
- a         [M, K]                    float8_e4m3fn   activations (any M >= 0)
- a_scales  [M, K / 128]              float32         one scale per row and 128-deep K block (any strides;
                                                      cuBLAS wants them column-major, the kernel takes both)
- b         [N, K]                    float8_e4m3fn   weights, row-major over K ("NT": C = A B^T)
- b_scales  [ceil(N / 128), K / 128]  float32         one scale per 128x128 weight tile; N need not be a
                                                      multiple of 128 (DeepSeek-V3 has N = 576 and 2112)
- out_dtype bfloat16 (DeepSeek-V3), float16 or float32;  C [M, N]

    C[m, n] = sum_kb (A[m, kb] . B[n, kb]) * a_scales[m, kb] * b_scales[n // 128, kb]

K must be a positive multiple of 128: partial K blocks are not supported (validated; every DeepSeek-V3
projection has K a multiple of 128). The activations come from `reference.quant.fp8.quantize_fp8(x,
granularity="group", group_size=128)`, the weights from `quantize_fp8_blocks(w, block=128)`.

Two references:
- `block_fp8_gemm_mirror` mirrors the kernel's precision: per 128-deep K block, the dot product of the same
  FP8 operands in fp32 (FP8 x FP8 products are exact in fp32), then `acc = acc + partial * (a_s * b_s)` in
  fp32, K blocks in ascending order, one rounding to `out_dtype` at the end.
  What the kernel's in-block accumulation really is (Triton 3.6, read in triton/backends/nvidia/
  compiler.py and triton/language/semantic.py): on sm_90, `tl.dot` of fp8 operands with an fp32 result
  defaults to `max_num_imprecise_acc = 2**30`, so Triton never promotes inside a dot: the 128-deep block is
  summed entirely in the wgmma FP8 accumulator, which keeps fewer bits than fp32 (about 14, DeepSeek-V3
  report, H800). The kernel calls one `tl.dot` per K block into a fresh accumulator and promotes across
  blocks in fp32 registers: DeepSeek's "promote every 128 elements" scheme. The mirror's in-block sum is
  plain fp32 (and the GPU may fuse `acc + partial * s` into one FMA), so it is not bit-exact with the GPU;
  the tolerance row ("block_fp8_gemm", out dtype) in kernels/tolerances covers that difference and
  nothing more. Under the Triton interpreter the in-block sum is an fp32 numpy matmul.
- `block_fp8_gemm_ideal`: the exact product of the dequantized operands, in float64. The suites measure
  SQNR against the product of the *unquantized* operands (`suites.oracles.unquantized_product`), which this
  file cannot see.

Edge-case policy: no scale is checked or clamped; NaN and Inf in codes (0x7F/0xFF are NaN in e4m3fn) or
scales propagate by IEEE fp32 arithmetic (a NaN code poisons its whole output row or column; Inf * 0 is
NaN). Results beyond the output format's range round to +-Inf (RNE cast). An output whose every term is
zero is +0.0 (the accumulator starts at +0.0). There are no subnormal or rounding choices before the final
cast: products are exact and sums are fp32 (ties to even).
"""

from __future__ import annotations

import torch

BLOCK = 128
OPERAND_DTYPE = torch.float8_e4m3fn
OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _check_scales(name: str, scales: torch.Tensor, want: tuple[int, int]) -> None:
    if not isinstance(scales, torch.Tensor) or scales.dtype != torch.float32:
        raise TypeError(f"{name}: must be a float32 tensor, got {getattr(scales, 'dtype', type(scales))}")
    if tuple(scales.shape) != want:
        raise ValueError(f"{name}: shape must be {want}, got {tuple(scales.shape)}")


def check_block_fp8_gemm_args(
    a: torch.Tensor, a_scales: torch.Tensor, b: torch.Tensor, b_scales: torch.Tensor, out_dtype: torch.dtype
) -> None:
    """Raise TypeError/ValueError naming the bad argument. Shared with the kernel launcher and fake impl."""
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor) or t.dtype != OPERAND_DTYPE:
            raise TypeError(f"{name}: dtype must be {OPERAND_DTYPE}, got {getattr(t, 'dtype', type(t))}")
        if t.dim() != 2:
            raise ValueError(f"{name}: must be 2-D, got shape {tuple(t.shape)}")
    m, k = a.shape
    n = b.shape[0]
    if b.shape[1] != k:
        raise ValueError(f"b: K = {b.shape[1]} does not match a's K = {k} (b is [N, K])")
    if k == 0 or k % BLOCK:
        raise ValueError(f"a: K = {k} must be a positive multiple of {BLOCK}; partial K blocks are not supported")
    if out_dtype not in OUT_DTYPES:
        raise TypeError(f"out_dtype: must be one of {OUT_DTYPES}, got {out_dtype}")
    _check_scales("a_scales", a_scales, (m, k // BLOCK))
    _check_scales("b_scales", b_scales, (-(-n // BLOCK), k // BLOCK))


def weight_scales_per_row(b_scales: torch.Tensor, n: int) -> torch.Tensor:
    """[ceil(N / 128), KB] -> [N, KB]: the scale of each weight row's tile."""
    return b_scales.repeat_interleave(BLOCK, dim=0)[:n]


def block_fp8_gemm_mirror(
    a: torch.Tensor,
    a_scales: torch.Tensor,
    b: torch.Tensor,
    b_scales: torch.Tensor,
    out_dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """The kernel's arithmetic in fp32: per K block `acc = acc + (A_kb B_kb^T) * (a_s * b_s)`, then one cast."""
    check_block_fp8_gemm_args(a, a_scales, b, b_scales, out_dtype)
    m, k = a.shape
    n = b.shape[0]
    b_rows = weight_scales_per_row(b_scales, n)
    acc = torch.zeros(m, n, dtype=torch.float32, device=a.device)
    for kb in range(k // BLOCK):
        cols = slice(kb * BLOCK, (kb + 1) * BLOCK)
        partial = a[:, cols].to(torch.float32) @ b[:, cols].to(torch.float32).T
        acc = acc + partial * (a_scales[:, kb, None] * b_rows[None, :, kb])
    return acc.to(out_dtype)


def dequantize_activations(a: torch.Tensor, a_scales: torch.Tensor) -> torch.Tensor:
    """float64 A * a_scales: each element times the scale of its 1 x 128 group (exact)."""
    return a.to(torch.float64) * a_scales.to(torch.float64).repeat_interleave(BLOCK, dim=1)


def dequantize_weights(b: torch.Tensor, b_scales: torch.Tensor) -> torch.Tensor:
    """float64 B * b_scales: each element times the scale of its 128 x 128 tile (exact)."""
    rows = weight_scales_per_row(b_scales, b.shape[0]).to(torch.float64)
    return b.to(torch.float64) * rows.repeat_interleave(BLOCK, dim=1)


def dequantize_operands(
    a: torch.Tensor, a_scales: torch.Tensor, b: torch.Tensor, b_scales: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 A * a_scales and B * b_scales, each element times the scale of its group or tile (exact)."""
    return dequantize_activations(a, a_scales), dequantize_weights(b, b_scales)


def block_fp8_gemm_ideal(
    a: torch.Tensor, a_scales: torch.Tensor, b: torch.Tensor, b_scales: torch.Tensor
) -> torch.Tensor:
    """float64 product of the dequantized operands: what the quantized GEMM means, without rounding."""
    check_block_fp8_gemm_args(a, a_scales, b, b_scales, torch.float32)
    a64, b64 = dequantize_operands(a, a_scales, b, b_scales)
    return a64 @ b64.T
