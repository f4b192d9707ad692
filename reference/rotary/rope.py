"""Rotary position embedding, NeoX / HF-Llama "rotate half" style: the definition the Triton kernel is checked
against.

Spec (Su et al. 2021, as HF transformers' Llama and SmolLM2 apply it): head dim D (even), half = D / 2;
dim i of a head pairs with dim i + half (not 2i with 2i + 1, GPT-J's interleaved style). For a token at
position p and i < half, with theta_i = p * inv_freq[i] and inv_freq[i] = 1 / base^(2i / D):

    out[i]        = x[i] * cos(theta_i) - x[i + half] * sin(theta_i)
    out[i + half] = x[i + half] * cos(theta_i) + x[i] * sin(theta_i)

The same rotation is applied to every head of q [T, Hq, D] and of k [T, Hkv, D].

cos/sin table (`rope_cos_sin_cache`): [P, D] float32, cos(theta) in the first half of each row, sin(theta) in
the second, rows indexed by position. It is computed with the op order of runner/model/layers.py
RotaryEmbedding (`inv_freq = 1.0 / (base ** (arange(0, D, 2, int64).float() / D))`, angles `p.float() *
inv_freq` in fp32, torch's fp32 cos and sin), so its rows equal RotaryEmbedding.cos_sin(p, float32) bit for bit
(suites/rotary/test_rope.py checks it).

Precision (`apply_rope`, the mirror): x widened to fp32, `out = x * cos + rotate_half(x) * sin` in fp32 with
`rotate_half(x) = cat(-x[half:], x[:half])`, the expression and op order of the runner's `_rotate` (two rounded
products, one rounded sum: no FMA), rounded once to x's dtype (RNE). For fp32 inputs this equals the runner's
current result bit for bit. For bf16/fp16 it does NOT equal the runner's current eager result: the runner rounds
cos/sin to the activation dtype and rounds after every op in that dtype; the mirror (like the kernel) keeps fp32
throughout and rounds once, which is closer to the ideal.

Edge-case policy (all follow from the formula in IEEE fp32): NaN in x poisons its own output and its partner's
(i and i + half); +-Inf gives +-Inf or NaN the same way, and at position 0 (sin = +0 exactly) an Inf's partner
becomes NaN (Inf * 0). Position 0 is the identity on finite values (cos = 1, sin = 0) except that a -0 whose
rotated partner is non-negative becomes +0 (-0 + +0). Subnormals are ordinary fp32 values after widening; the
final rounding may overflow to Inf only where |out| exceeds the dtype's range (up to sqrt(2) * max |x|).
Positions must lie in [0, P): the reference checks them (a host sync); the kernel does not (see kernels/rope.py).
"""

from __future__ import annotations

import torch

DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def rope_cos_sin_cache(head_dim: int, base: float, max_positions: int, device=None) -> torch.Tensor:
    """[max_positions, head_dim] float32: cos of each position's angles in the first head_dim / 2 columns,
    sin in the last head_dim / 2 (RotaryEmbedding's op order; see the module docstring)."""
    if head_dim <= 0 or head_dim % 2:
        raise ValueError(f"head_dim: must be a positive even number, got {head_dim}")
    if max_positions <= 0:
        raise ValueError(f"max_positions: must be positive, got {max_positions}")
    if not base > 0:
        raise ValueError(f"base: must be positive, got {base}")
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim))
    positions = torch.arange(max_positions, dtype=torch.int64, device=device)
    angles = positions.float()[:, None] * inv_freq[None, :]  # [P, D/2], fp32
    return torch.cat((angles.cos(), angles.sin()), dim=-1)


def check_rope_args(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor) -> None:
    """Raise TypeError/ValueError naming the bad argument (no value checks: no host sync). Shared with the
    kernel launcher."""
    if q.dtype not in DTYPES:
        raise TypeError(f"q: dtype must be one of {DTYPES}, got {q.dtype}")
    if k.dtype != q.dtype:
        raise TypeError(f"k: dtype must be q's {q.dtype}, got {k.dtype}")
    if q.dim() != 3:
        raise ValueError(f"q: must be 3-D [tokens, heads, head_dim], got shape {tuple(q.shape)}")
    if k.dim() != 3:
        raise ValueError(f"k: must be 3-D [tokens, kv_heads, head_dim], got shape {tuple(k.shape)}")
    if k.shape[0] != q.shape[0] or k.shape[2] != q.shape[2]:
        raise ValueError(
            f"k: tokens and head_dim must match q's {q.shape[0]} and {q.shape[2]}, got shape {tuple(k.shape)}"
        )
    head_dim = q.shape[2]
    if head_dim == 0 or head_dim % 2:
        raise ValueError(f"q: head_dim must be a positive even number, got {head_dim}")
    if cos_sin_cache.dtype != torch.float32:
        raise TypeError(f"cos_sin_cache: dtype must be torch.float32, got {cos_sin_cache.dtype}")
    if cos_sin_cache.dim() != 2 or cos_sin_cache.shape[1] != head_dim:
        raise ValueError(
            f"cos_sin_cache: must be [max_positions, {head_dim}] (cos half, sin half), got shape "
            f"{tuple(cos_sin_cache.shape)}"
        )
    if positions.dtype != torch.int64:
        raise TypeError(f"positions: dtype must be torch.int64, got {positions.dtype}")
    if positions.shape != (q.shape[0],):
        raise ValueError(f"positions: shape must be ({q.shape[0]},) (one per token of q), got {tuple(positions.shape)}")
    for name, t in (("k", k), ("positions", positions), ("cos_sin_cache", cos_sin_cache)):
        if t.device != q.device:
            raise ValueError(f"{name}: on {t.device}, but q is on {q.device}; all tensors must share a device")


def check_positions_in_range(positions: torch.Tensor, cos_sin_cache: torch.Tensor) -> None:
    """Every position indexes a row of the table (reads the values: a host sync)."""
    rows = cos_sin_cache.shape[0]
    if positions.numel() and (int(positions.min()) < 0 or int(positions.max()) >= rows):
        raise ValueError(
            f"positions: must lie in [0, {rows}) (cos_sin_cache rows), got "
            f"[{int(positions.min())}, {int(positions.max())}]"
        )


def _cos_sin(positions: torch.Tensor, cos_sin_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [T, 1, D] of the tokens (each half repeated: the runner's `cat((angles, angles))` layout)."""
    half = cos_sin_cache.shape[1] // 2
    rows = cos_sin_cache[positions]
    cos, sin = rows[:, :half], rows[:, half:]
    return torch.cat((cos, cos), dim=-1)[:, None, :], torch.cat((sin, sin), dim=-1)[:, None, :]


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def apply_rope(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(q_out, k_out): new tensors of q's and k's shapes and dtype (the inputs are not modified)."""
    check_rope_args(q, k, positions, cos_sin_cache)
    check_positions_in_range(positions, cos_sin_cache)
    cos, sin = _cos_sin(positions, cos_sin_cache)
    return _rotate(q.float(), cos, sin).to(q.dtype), _rotate(k.float(), cos, sin).to(k.dtype)
