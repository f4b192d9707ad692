"""SiLU-and-mul in Triton, the kernel twin of `reference.activation.silu_and_mul` (its docstring is the
contract), optionally quantizing what it produces for a block-FP8 GEMM.

Ops: `touchstone::silu_and_mul(x) -> out [..., I]` and `touchstone::silu_and_mul_fp8(x, group_size) -> (codes
e4m3fn [..., I], scales fp32 [..., I / group_size])`; call them through `silu_and_mul` and `silu_and_mul_fp8`.

Grid (rows, column blocks): a program reads BLOCK gate columns and the BLOCK up columns I further on, computes
silu(gate) * up in fp32 (exp and the division are the GPU's, hence lossy against the mirror) and rounds once
to x's dtype. The FP8 form then quantizes those rounded values per 128-wide group in registers
(`kernels._fp8_groups`: the reference quantizer's arithmetic), so it writes 1 byte a value instead of 2 and the
GEMM needs no quantization launch of its own; its codes and scales equal the reference quantizer's over the
unfused form's output, bit for bit. The runner's eager form, `F.silu(gate) * up`, was two launches and a round
trip of the silu through memory.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._boundary import as_rows, check_device, f32_bits
from kernels._fp8_groups import e4m3fn_groups
from kernels._pdl import launch_args, wait_then_release
from reference.activation.silu_and_mul import check_silu_and_mul_args
from reference.quant.fp8 import DEFAULT_EPS

# Planted bugs for the suite's negative controls; FAULT is a constexpr, so fault 0 compiles them away.
FAULTS = {
    "none": 0,
    "gate_up_swapped": 1,  # silu(up) * gate
}
# Columns a program: a whole number of 128-wide groups. Decode rows are short work (Llama-3.1-8B's I = 14336
# is 14 programs a token), so the grid, not the block, carries the parallelism; the interpreter runs few
# programs of any size alike.
_BLOCK = 1024
_WARPS = 4


@triton.jit
def _silu_and_mul_kernel(
    x_ptr,
    out_ptr,
    scale_ptr,
    inter,
    x_row_stride,
    eps_bits,
    BLOCK: tl.constexpr,
    GROUP: tl.constexpr,
    FP8: tl.constexpr,
    FAULT: tl.constexpr,
    PDL: tl.constexpr,
):
    wait_then_release(PDL)  # kernels._pdl: before any read of an earlier kernel's output
    row = tl.program_id(0).to(tl.int64)
    col = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = col < inter
    gate = tl.load(x_ptr + row * x_row_stride + col, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * x_row_stride + inter + col, mask=mask, other=0.0).to(tl.float32)
    if FAULT == 1:
        gate, up = up, gate
    out = (gate / (1.0 + tl.exp(-gate)) * up).to(x_ptr.dtype.element_ty)
    if FP8:  # padding lanes are 0: they never raise a group's amax, and are not stored
        codes, scale = e4m3fn_groups(tl.reshape(out.to(tl.float32), [BLOCK // GROUP, GROUP]), eps_bits)
        tl.store(out_ptr + row * inter + col, tl.reshape(codes, [BLOCK]), mask=mask)
        group = tl.program_id(1) * (BLOCK // GROUP) + tl.arange(0, BLOCK // GROUP)
        tl.store(scale_ptr + row * (inter // GROUP) + group, scale, mask=group * GROUP < inter)
    else:
        tl.store(out_ptr + row * inter + col, out, mask=mask)


def launch_silu_and_mul(x: torch.Tensor, group_size: int | None = None, fault: str = "none"):
    """Validate, allocate and launch: out, or with `group_size` (codes, scales). `fault` plants a named bug."""
    inter = check_silu_and_mul_args(x)
    check_device(x=x)
    if group_size is not None and (group_size != 128 or inter % group_size):
        raise ValueError(
            f"group_size: the FP8 form quantizes whole 128-wide groups of the output, got group_size {group_size} "
            f"for {inter} output columns"
        )
    rows = as_rows(x, "x")
    shape = (*x.shape[:-1], inter)
    fp8 = group_size is not None
    out = torch.empty(shape, dtype=torch.float8_e4m3fn if fp8 else x.dtype, device=x.device)
    scales = torch.empty((*x.shape[:-1], inter // 128 if fp8 else 0), dtype=torch.float32, device=x.device)
    if rows.shape[0] and inter:
        block = min(_BLOCK, max(128, triton.next_power_of_2(inter)))
        _silu_and_mul_kernel[(rows.shape[0], triton.cdiv(inter, block))](
            rows,
            out.view(torch.uint8) if fp8 else out,
            scales,
            inter,
            rows.stride(0),
            f32_bits(DEFAULT_EPS),
            BLOCK=block,
            GROUP=128,
            FP8=fp8,
            FAULT=FAULTS[fault],
            num_warps=_WARPS,
            **launch_args(x.device),
        )
    return (out, scales) if fp8 else out


@torch.library.custom_op("touchstone::silu_and_mul", mutates_args=())
def _silu_and_mul_op(x: torch.Tensor) -> torch.Tensor:
    return launch_silu_and_mul(x)


@_silu_and_mul_op.register_fake
def _(x):
    inter = check_silu_and_mul_args(x)
    return x.new_empty((*x.shape[:-1], inter))


@torch.library.custom_op("touchstone::silu_and_mul_fp8", mutates_args=())
def _silu_and_mul_fp8_op(x: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    return launch_silu_and_mul(x, group_size)


@_silu_and_mul_fp8_op.register_fake
def _(x, group_size):
    inter = check_silu_and_mul_args(x)
    if group_size != 128 or inter % group_size:
        raise ValueError(f"group_size: the FP8 form quantizes whole 128-wide groups, got {group_size} for {inter}")
    codes = x.new_empty((*x.shape[:-1], inter), dtype=torch.float8_e4m3fn)
    return codes, x.new_empty((*x.shape[:-1], inter // group_size), dtype=torch.float32)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """Kernel twin of `reference.activation.silu_and_mul.silu_and_mul_mirror` (within its lossy row)."""
    return torch.ops.touchstone.silu_and_mul(x)


def silu_and_mul_fp8(x: torch.Tensor, group_size: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """Kernel twin of `reference.activation.silu_and_mul.silu_and_mul_fp8`: quantize_fp8 of `silu_and_mul(x)`,
    bit for bit."""
    return torch.ops.touchstone.silu_and_mul_fp8(x, group_size)
