"""Operands of a block-FP8 GEMM problem and the vendor peers that multiply them, shared by the registered
benchmark (bench/gemm/block_fp8.py) and the launch sweep (bench/gemm/block_fp8_launch_sweep.py).

cuBLAS through `torch._scaled_mm(a, b.t(), scale_a, scale_b, out_dtype=bf16)` (torch >= 2.9, CUDA >= 12.9,
sm_90), written from torch's meta function (torch/_meta_registrations.py, `meta_scaled_mm`) and its inductor
test `test_main_loop_scaling`; not run here (no GPU):
- blockwise (BlockWise1x128 x BlockWise128x128): `scale_a` [M, K/128] fp32 *column-major* ("outer-dim-major":
  `s.t().contiguous().t()`), `scale_b` = the weight scales [ceil(N/128), K/128] passed transposed (a [K/128,
  ceil(N/128)] view); `use_fast_accum` must be False (cuBLAS refuses fast accumulation with block scales);
  bf16 output only. Each scale column must start 16-byte aligned, so M is padded to a multiple of 4 with
  zero rows (the padding is built untimed; the timed call returns the first M rows) and the weight scales'
  K/128 to a multiple of 4 (a strided view of a padded buffer; every DeepSeek-V3 K already is).
- rowwise FP8: `scale_a` [M, 1], `scale_b` [1, N] fp32, contiguous; the operands are requantized per row
  from the dequantized block-FP8 operands (untimed), use_fast_accum=False (same accumulation as blockwise).
- bf16: `torch.matmul` of the dequantized operands rounded to bf16.
"""

from __future__ import annotations

import dataclasses

import torch

from reference.gemm.block_fp8 import BLOCK, dequantize_operands
from reference.quant.fp8 import quantize_fp8, quantize_fp8_blocks

FP8 = torch.float8_e4m3fn


@dataclasses.dataclass
class Operands:
    a: torch.Tensor  # [M, K] e4m3fn
    a_scales: torch.Tensor  # [M, K/128] fp32, column-major (cuBLAS's layout; the Triton kernel takes any)
    b: torch.Tensor  # [N, K] e4m3fn
    b_scales: torch.Tensor  # [ceil(N/128), K/128] fp32
    peer: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)  # prepared peer inputs

    @property
    def args(self) -> tuple[torch.Tensor, ...]:
        return self.a, self.a_scales, self.b, self.b_scales


def make_operands(m: int, n: int, k: int, torch_device: str, peers: bool = True) -> Operands:
    """randn activations and weights, block-quantized by the reference quantizers on the device."""
    generator = torch.Generator(device=torch_device).manual_seed(0)
    x = torch.randn(m, k, dtype=torch.bfloat16, device=torch_device, generator=generator)
    w = torch.randn(n, k, dtype=torch.bfloat16, device=torch_device, generator=generator)
    a, a_scales = quantize_fp8(x, granularity="group", group_size=BLOCK)
    b, b_scales = quantize_fp8_blocks(w, block=BLOCK)
    del x, w
    ops = Operands(a, a_scales.t().contiguous().t(), b, b_scales)
    if peers and torch_device != "cpu":
        prepare_peers(ops)
    return ops


def _pad_rows(t: torch.Tensor, multiple: int) -> torch.Tensor:
    extra = -t.shape[0] % multiple
    return torch.cat([t, t.new_zeros(extra, *t.shape[1:])]) if extra else t


def prepare_peers(ops: Operands) -> None:
    m = ops.a.shape[0]
    kb = ops.a_scales.shape[1]
    a4 = _pad_rows(ops.a.view(torch.uint8), 4).view(FP8)
    ops.peer["blockwise_a"] = a4
    ops.peer["blockwise_scale_a"] = _pad_rows(ops.a_scales.contiguous(), 4).t().contiguous().t()
    padded = torch.zeros(ops.b_scales.shape[0], kb + (-kb % 4), dtype=torch.float32, device=ops.a.device)
    padded[:, :kb] = ops.b_scales
    ops.peer["blockwise_scale_b"] = padded[:, :kb].t()  # [K/128, ceil(N/128)], 16-byte aligned columns
    a64, b64 = dequantize_operands(*ops.args)
    ops.peer["bf16_a"], ops.peer["bf16_b"] = a64.to(torch.bfloat16), b64.to(torch.bfloat16)
    ra, rsa = quantize_fp8(a64.float(), granularity="token")
    rb, rsb = quantize_fp8(b64.float(), granularity="token")
    ops.peer["rowwise_a"], ops.peer["rowwise_scale_a"] = ra, rsa.reshape(m, 1).contiguous()
    ops.peer["rowwise_b"], ops.peer["rowwise_scale_b"] = rb, rsb.reshape(1, -1).contiguous()
    del a64, b64


def cublas_blockwise(ops: Operands):
    p, m = ops.peer, ops.a.shape[0]
    return lambda: torch._scaled_mm(
        p["blockwise_a"],
        ops.b.t(),
        p["blockwise_scale_a"],
        p["blockwise_scale_b"],
        out_dtype=torch.bfloat16,
        use_fast_accum=False,
    )[:m]


def cublas_rowwise(ops: Operands):
    p = ops.peer
    return lambda: torch._scaled_mm(
        p["rowwise_a"],
        p["rowwise_b"].t(),
        p["rowwise_scale_a"],
        p["rowwise_scale_b"],
        out_dtype=torch.bfloat16,
        use_fast_accum=False,
    )


def bf16_matmul(ops: Operands):
    p = ops.peer
    return lambda: torch.matmul(p["bf16_a"], p["bf16_b"].t())


def gemm_flops(m: int, n: int, k: int) -> int:
    return 2 * m * n * k


def gemm_bytes(m: int, n: int, k: int) -> int:
    """Compulsory traffic: FP8 operands, fp32 scales, bf16 output."""
    return m * k + n * k + 4 * (m * (k // BLOCK) + -(-n // BLOCK) * (k // BLOCK)) + 2 * m * n
