"""Block-FP8 linear in one Triton kernel: x (bf16/fp16) quantized per 1x128 group as the GEMM loads it, then
the block-FP8 GEMM, mirrored by `reference.gemm.block_fp8_linear.block_fp8_linear_mirror`.

Op: `touchstone::block_fp8_linear(x, b, b_scales, out_dtype) -> C`; call it through `block_fp8_linear`.

The kernel is `kernels.block_fp8_gemm`'s with QUANT_A: each K step loads x's [BLOCK_M, 128] tile instead of
FP8 codes and a scale per row, and quantizes it in registers by the quantize kernel's own rule
(`kernels.fp8_quant.quantize_rows_e4m3fn`), so its codes and scales are those of `quantize_fp8` then
`block_fp8_gemm`, and so is the result, bit for bit. What it saves is the quantize kernel's launch and its
round trip of the codes through memory; what it costs is quantizing x once per N tile (N / BLOCK_N times),
nothing at decode's few rows, too much for a prefill's thousands. The runner takes it for at most
`FUSED_MAX_ROWS` rows (runner/model/quant/fp8_block.py).
"""

from __future__ import annotations

import torch

from kernels import block_fp8_gemm
from kernels._boundary import check_device
from reference.gemm.block_fp8_linear import check_block_fp8_linear_args


def launch_block_fp8_linear(
    x: torch.Tensor,
    b: torch.Tensor,
    b_scales: torch.Tensor,
    out_dtype: torch.dtype = torch.bfloat16,
    config: block_fp8_gemm.LaunchConfig | None = None,
    fault: str = "none",
) -> torch.Tensor:
    """Validate, allocate and launch; `config` and `fault` as `kernels.block_fp8_gemm.launch_block_fp8_gemm`."""
    check_block_fp8_linear_args(x, b, b_scales, out_dtype)
    device = check_device(x=x, b=b, b_scales=b_scales)
    return block_fp8_gemm.launch(x, None, b, b_scales, out_dtype, device, config, fault)


@torch.library.custom_op("touchstone::block_fp8_linear", mutates_args=())
def _block_fp8_linear_op(
    x: torch.Tensor, b: torch.Tensor, b_scales: torch.Tensor, out_dtype: torch.dtype
) -> torch.Tensor:
    return launch_block_fp8_linear(x, b, b_scales, out_dtype)


@_block_fp8_linear_op.register_fake
def _(x, b, b_scales, out_dtype):
    check_block_fp8_linear_args(x, b, b_scales, out_dtype)
    return x.new_empty(x.shape[0], b.shape[0], dtype=out_dtype)


def block_fp8_linear(
    x: torch.Tensor, b: torch.Tensor, b_scales: torch.Tensor, out_dtype: torch.dtype = torch.bfloat16
) -> torch.Tensor:
    """Kernel twin of `reference.gemm.block_fp8_linear.block_fp8_linear_mirror` (same arguments)."""
    return torch.ops.touchstone.block_fp8_linear(x, b, b_scales, out_dtype)
