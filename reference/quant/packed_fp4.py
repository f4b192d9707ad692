"""Argument checks shared by the packed-FP4 formats (MXFP4, NVFP4): E2M1 codes two a byte along the last dim,
one uint8 scale per block of `block` elements. Each raises TypeError/ValueError naming the bad argument."""

from __future__ import annotations

import torch


def check_fp4_input(x: torch.Tensor, block: int, dtypes: tuple[torch.dtype, ...]) -> None:
    """x: a tensor of one of `dtypes` whose last dim is whole blocks."""
    if not isinstance(x, torch.Tensor) or x.dtype not in dtypes:
        raise TypeError(f"x: dtype must be one of {dtypes}, got {getattr(x, 'dtype', type(x).__name__)}")
    if x.dim() == 0 or x.shape[-1] % block:
        raise ValueError(f"x: last dim must be a multiple of {block}, got shape {tuple(x.shape)}")


def check_packed_fp4(
    codes: torch.Tensor,
    scales: torch.Tensor,
    dtype: torch.dtype,
    block: int,
    out_dtypes: tuple[torch.dtype, ...],
    fmt: str,
) -> None:
    """dtype one of `out_dtypes`; codes [..., K//2] and scales [..., K//block], both uint8, of one `fmt` tensor."""
    if dtype not in out_dtypes:
        raise TypeError(f"dtype must be one of {out_dtypes}, got {dtype}")
    for name, t in (("codes", codes), ("scales", scales)):
        if t.dtype != torch.uint8:
            raise TypeError(f"{name}: dtype must be torch.uint8, got {t.dtype}")
    same_rows = codes.dim() > 0 and codes.shape[:-1] == scales.shape[:-1]
    if not same_rows or codes.shape[-1] * 2 != scales.shape[-1] * block:
        raise ValueError(
            f"codes {tuple(codes.shape)} and scales {tuple(scales.shape)} do not describe one {fmt} tensor: "
            f"need codes [..., K//2] and scales [..., K//{block}]"
        )
