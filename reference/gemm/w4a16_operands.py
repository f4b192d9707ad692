"""The operand checks every W4A16 GEMM over packed FP4 weights shares (MXFP4, NVFP4): bf16 x [M, K], codes uint8
[N, K // 2], one uint8 scale byte per block of `block` weights [N, K // block]. Each raises TypeError/ValueError
naming the bad argument; the references and the kernel launchers call them at the boundary."""

from __future__ import annotations

import torch

X_DTYPES = (torch.bfloat16,)


def check_w4a16_operands(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, block: int, fmt: str) -> None:
    for name, t in (("x", x), ("codes", codes), ("scales", scales)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: must be a torch.Tensor, got {type(t).__name__}")
    if x.dtype not in X_DTYPES:
        raise TypeError(f"x: dtype must be one of {X_DTYPES}, got {x.dtype}")
    for name, t in (("codes", codes), ("scales", scales)):
        if t.dtype != torch.uint8:
            raise TypeError(f"{name}: dtype must be torch.uint8, got {t.dtype}")
    if x.dim() != 2:
        raise ValueError(f"x: must be 2-D [M, K], got shape {tuple(x.shape)}")
    if codes.dim() != 2 or scales.dim() != 2:
        raise ValueError(
            f"codes and scales: must be 2-D [N, K//2] and [N, K//{block}], got {tuple(codes.shape)} "
            f"and {tuple(scales.shape)}"
        )
    k = x.shape[1]
    if k % block:
        raise ValueError(f"x: K = {k} is not a multiple of the {fmt} block size {block}")
    if codes.shape[1] * 2 != k:
        raise ValueError(f"codes: shape {tuple(codes.shape)} does not match K = {k} (need [N, {k // 2}])")
    if scales.shape != (codes.shape[0], k // block):
        raise ValueError(
            f"scales: shape {tuple(scales.shape)}, need [N, K//{block}] = [{codes.shape[0]}, {k // block}]"
        )
