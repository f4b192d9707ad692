"""Mamba causal depthwise conv1d (prefill) and its one-token decode update with a rolling conv state.

Follows the `causal_conv1d_fn` / `causal_conv1d_update` contract of Dao-AILab/causal-conv1d as vLLM uses it for
Mamba2 (conv state layout "SD" = [state_len, dim], dim contiguous, state_len = width - 1), token-major:
- `causal_conv1d(x [B, L, dim], weight [dim, width], bias [dim] | None, initial_state [B, width-1, dim] | None,
  activation None | "silu") -> (out [B, L, dim] in x's dtype, final_state [B, width-1, dim])`:
      xpad = cat(initial_state (zeros if None), x) along L
      out[b, t, c] = act(bias[c] + sum_k weight[c, k] * xpad[b, t + k, c])
  final_state = the last width - 1 rows of xpad, in initial_state's dtype (x's if None); for L < width - 1 it
  keeps the tail of initial_state.
- `causal_conv1d_update(x [B, dim], conv_state [num_slots, width-1, dim], weight, bias, activation,
  state_indices, pad_slot_id) -> out [B, dim]`: decode, one token per request. Request i uses slot
  state_indices[i] (reference.mamba.slots; pad entries skip the slot, out row 0); the slot is updated IN PLACE
  to its last width - 2 rows followed by x[i] (in the state's dtype), and out[i] equals causal_conv1d on that
  one token with initial_state = the slot's previous state.

Precision (the mirror of kernels.mamba_conv1d_update): every operand is read as fp32; acc = bias (0.0 without
one), then for k = 0 .. width-1: acc = acc + weight[c, k] * xpad[t + k, c] (the product rounded, then the add:
no fused multiply-add); SiLU: acc * (1 / (1 + exp(-acc))) in fp32; one rounding (RNE) to x's dtype. The state
rows are copies (x's value rounded once to the state's dtype when they differ). Only exp can differ between
implementations (an ulp), so without activation a kernel matches bit for bit. `causal_conv1d_ideal` is the
same math in float64 (the SQNR reference).

Edge-case policy: IEEE. A NaN or Inf in a request's tokens reaches its own outputs for the next width - 1
positions (and its own state slot), nothing else; -0.0 products add to +0.0 unless every addend is -0.0 and
there is no bias (then acc starts at +0.0 and stays +0.0). Subnormals are kept. Activations other than None
and "silu" are refused.
"""

from __future__ import annotations

import torch

from reference.mamba.slots import check_state_indices, check_tensor, slot_rows

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
ACTIVATIONS = (None, "silu")


def _check_float(name: str, t: object) -> torch.Tensor:
    check_tensor(name, t)
    if t.dtype not in DTYPES:
        raise TypeError(f"{name}: dtype must be one of {DTYPES}, got {t.dtype}")
    return t


def _check_weights(weight, bias, activation, dim: int, device: torch.device) -> int:
    _check_float("weight", weight)
    if weight.dim() != 2 or weight.shape[0] != dim or weight.shape[1] < 2:
        raise ValueError(f"weight: must be [dim {dim}, width >= 2], got shape {list(weight.shape)}")
    if weight.device != device:
        raise ValueError(f"weight: on {weight.device}, x is on {device}")
    if bias is not None:
        _check_float("bias", bias)
        if tuple(bias.shape) != (dim,):
            raise ValueError(f"bias: shape must be [{dim}], got {list(bias.shape)}")
        if bias.device != device:
            raise ValueError(f"bias: on {bias.device}, x is on {device}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation: must be one of {ACTIVATIONS}, got {activation!r}")
    return weight.shape[1]


def check_causal_conv1d_args(x, weight, bias=None, initial_state=None, activation=None) -> int:
    """TypeError/ValueError naming the argument; returns width."""
    _check_float("x", x)
    if x.dim() != 3:
        raise ValueError(f"x: must be [batch, seqlen, dim], got shape {list(x.shape)}")
    batch, _, dim = x.shape
    width = _check_weights(weight, bias, activation, dim, x.device)
    if initial_state is not None:
        _check_float("initial_state", initial_state)
        if tuple(initial_state.shape) != (batch, width - 1, dim):
            raise ValueError(
                f"initial_state: shape must be [{batch}, {width - 1}, {dim}], got {list(initial_state.shape)}"
            )
        if initial_state.device != x.device:
            raise ValueError(f"initial_state: on {initial_state.device}, x is on {x.device}")
    return width


def check_causal_conv1d_update_args(
    x, conv_state, weight, bias=None, activation=None, state_indices=None
) -> tuple[int, int, int, int]:
    """Shapes, dtypes and devices (no values: shared with the kernel launcher); TypeError/ValueError naming the
    argument. Returns (num_slots, batch, dim, width)."""
    _check_float("x", x)
    if x.dim() != 2:
        raise ValueError(f"x: must be [batch, dim], got shape {list(x.shape)}")
    batch, dim = x.shape
    width = _check_weights(weight, bias, activation, dim, x.device)
    _check_float("conv_state", conv_state)
    if conv_state.dim() != 3 or conv_state.shape[1:] != (width - 1, dim):
        raise ValueError(
            f"conv_state: must be [num_slots, width-1 = {width - 1}, dim = {dim}] (layout SD), got "
            f"shape {list(conv_state.shape)}"
        )
    if conv_state.device != x.device:
        raise ValueError(f"conv_state: on {conv_state.device}, x is on {x.device}")
    check_state_indices(state_indices, batch, x.device)
    return conv_state.shape[0], batch, dim, width


def _silu(acc: torch.Tensor) -> torch.Tensor:
    one = torch.ones_like(acc)
    return acc * (one / (one + torch.exp(-acc)))


def _conv(
    xpad: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, activation: str | None, length: int
) -> torch.Tensor:
    """xpad [n, length + width - 1, dim] -> acc [n, length, dim] in xpad's dtype (fp32, or fp64 for the
    ideal), in the pinned order."""
    w = weight.to(xpad.dtype)
    acc = torch.zeros((xpad.shape[0], length, xpad.shape[2]), dtype=xpad.dtype, device=xpad.device)
    if bias is not None:
        acc = acc + bias.to(xpad.dtype)
    for k in range(w.shape[1]):
        acc = acc + w[:, k] * xpad[:, k : k + length, :]
    return _silu(acc) if activation == "silu" else acc


def causal_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    initial_state: torch.Tensor | None = None,
    activation: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Prefill over whole sequences; returns (out in x's dtype, final_state)."""
    width = check_causal_conv1d_args(x, weight, bias, initial_state, activation)
    batch, length, dim = x.shape
    if initial_state is None:
        initial_state = torch.zeros((batch, width - 1, dim), dtype=x.dtype, device=x.device)
    xpad = torch.cat([initial_state.to(torch.float32), x.to(torch.float32)], dim=1)
    out = _conv(xpad, weight, bias, activation, length).to(x.dtype)
    final_state = torch.cat([initial_state, x.to(initial_state.dtype)], dim=1)[:, length:]
    return out, final_state.contiguous()


def causal_conv1d_ideal(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    initial_state: torch.Tensor | None = None,
    activation: str | None = None,
) -> torch.Tensor:
    """The same math in float64 on the same inputs: out float64 [B, L, dim] (the ideal, for SQNR)."""
    check_causal_conv1d_args(x, weight, bias, initial_state, activation)
    batch, length, dim = x.shape
    init = (
        torch.zeros((batch, weight.shape[1] - 1, dim), dtype=torch.float64, device=x.device)
        if (initial_state is None)
        else initial_state.to(torch.float64)
    )
    return _conv(torch.cat([init, x.to(torch.float64)], dim=1), weight, bias, activation, length)


def causal_conv1d_update(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
    state_indices: torch.Tensor | None = None,
    pad_slot_id: int = -1,
) -> torch.Tensor:
    """Decode: one token per request; conv_state updated in place; returns out [B, dim] in x's dtype."""
    num_slots, batch, _, _ = check_causal_conv1d_update_args(x, conv_state, weight, bias, activation, state_indices)
    pairs = slot_rows(state_indices, batch, num_slots, pad_slot_id, x.device)
    out = torch.zeros(x.shape, dtype=x.dtype, device=x.device)
    if not pairs:
        return out
    req = torch.tensor([i for i, _ in pairs], device=x.device)
    slot = torch.tensor([s for _, s in pairs], device=x.device)
    old = conv_state[slot]  # [n, width-1, dim]
    token = x[req][:, None, :]
    xpad = torch.cat([old.to(torch.float32), token.to(torch.float32)], dim=1)
    out[req] = _conv(xpad, weight, bias, activation, 1)[:, 0].to(x.dtype)
    conv_state[slot] = torch.cat([old, token.to(conv_state.dtype)], dim=1)[:, 1:]
    return out
