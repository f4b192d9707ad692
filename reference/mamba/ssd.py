"""Mamba2 SSD (state-space duality): the chunked scan in segment-sum form, and the plain per-token recurrence
it must equal, written from the formulas of state-spaces/mamba's `ssd_minimal_discrete` and
`ssd_chunk_scan_combined_ref` (not copied).

Shapes: x [b, l, h, p], dt [b, l, h], A [h], B and C [b, l, g, n] with h a multiple of g (head i reads group
i // (h // g), as `repeat(B, "b l g n -> b l (g r) n")` does), D [h], z [b, l, h, p], dt_bias [h],
initial_states [b, h, p, n].

Per token t and head, with the state S [p, n] (zero or `initial_states` before the first token):
    dt_t  = softplus(dt_t + dt_bias) if dt_softplus else dt_t + dt_bias        (dt_bias defaults to 0)
    S_t   = exp(dt_t * A) * S_{t-1} + (dt_t * x_t) outer B_t
    y_t   = S_t @ C_t + D * x_t,   then   y_t *= silu(z_t)   when z is given
The chunked form (`ssd_chunked_scan`) cuts l into chunks of `chunk_size` tokens (l is padded with dt = 0
tokens, which neither decay nor feed the state, so the final state is unchanged) and computes
    intra-chunk:  y_diag = (C B^T * exp(segsum(dt A))) (dt x)           (the "attention-like" quadratic form)
    chunk states: the state each chunk leaves from its own tokens, decayed to the chunk end
    inter-chunk:  states entering each chunk = a recurrence over chunk ends (with the initial state first)
    y_off = C (state entering the chunk) * exp(cumsum(dt A))
`segsum(a)[..., i, j] = a[j+1] + ... + a[i]` for i >= j and -inf above the diagonal, computed as a masked
cumsum (the stable form: no difference of two large cumsums, so exp never sees cancellation error).

Precision: everything is computed in fp32, or in fp64 when any float input is fp64 (the suite's exactness
tier); y is returned in x's dtype, the final state in the compute dtype (fp32 states, vLLM's
`mamba_ssm_cache_dtype="float32"`). Edge cases: no special handling; NaN/Inf propagate through the
arithmetic (an Inf decay times a zero state gives NaN, as the recurrence does). A must be <= 0 for a stable
scan but is not checked (models store A = -exp(A_log)).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _check(name: str, t: torch.Tensor | None, shape: tuple[int, ...], optional: bool = False) -> None:
    if t is None:
        if optional:
            return
        raise TypeError(f"{name}: required tensor, got None")
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: must be a torch.Tensor, got {type(t).__name__}")
    if not t.is_floating_point():
        raise TypeError(f"{name}: must be a floating tensor, got {t.dtype}")
    if tuple(t.shape) != shape:
        raise ValueError(f"{name}: expected shape {shape}, got {tuple(t.shape)}")


def check_ssd_args(x, dt, A, B, C, *, D=None, z=None, dt_bias=None, initial_states=None) -> tuple[int, ...]:
    """Validate shapes and dtypes (naming the argument); returns (b, l, h, p, g, n)."""
    if not isinstance(x, torch.Tensor) or x.dim() != 4:
        raise ValueError(f"x: expected a [b, l, h, p] tensor, got {getattr(x, 'shape', type(x).__name__)}")
    b, seqlen, h, p = x.shape
    if not isinstance(B, torch.Tensor) or B.dim() != 4:
        raise ValueError(f"B: expected a [b, l, g, n] tensor, got {getattr(B, 'shape', type(B).__name__)}")
    g, n = B.shape[2], B.shape[3]
    if g == 0 or h % g:
        raise ValueError(f"B: group count {g} must divide the head count {h}")
    _check("x", x, (b, seqlen, h, p))
    _check("dt", dt, (b, seqlen, h))
    _check("A", A, (h,))
    _check("B", B, (b, seqlen, g, n))
    _check("C", C, (b, seqlen, g, n))
    _check("D", D, (h,), optional=True)
    _check("z", z, (b, seqlen, h, p), optional=True)
    _check("dt_bias", dt_bias, (h,), optional=True)
    _check("initial_states", initial_states, (b, h, p, n), optional=True)
    return b, seqlen, h, p, g, n


def _compute_dtype(*tensors: torch.Tensor | None) -> torch.dtype:
    return torch.float64 if any(t is not None and t.dtype == torch.float64 for t in tensors) else torch.float32


def discretize_dt(dt: torch.Tensor, dt_bias: torch.Tensor | None, dt_softplus: bool) -> torch.Tensor:
    """dt + dt_bias, then softplus when asked (torch's softplus: log1p(exp(v)), v itself above 20)."""
    if dt_bias is not None:
        dt = dt + dt_bias
    return F.softplus(dt) if dt_softplus else dt


def segsum(a: torch.Tensor) -> torch.Tensor:
    """[..., T] -> [..., T, T]: out[..., i, j] = sum(a[..., j+1 : i+1]) for i >= j, -inf for i < j."""
    t = a.shape[-1]
    rows = a[..., None, :].expand(*a.shape, t).transpose(-1, -2)  # rows[..., i, j] = a[..., i]
    strictly_below = torch.ones(t, t, dtype=torch.bool, device=a.device).tril(-1)
    out = rows.masked_fill(~strictly_below, 0).cumsum(dim=-2)
    return out.masked_fill(~torch.ones(t, t, dtype=torch.bool, device=a.device).tril(0), -torch.inf)


def _heads(t: torch.Tensor, h: int) -> torch.Tensor:
    """[b, l, g, n] -> [b, l, h, n]: each group serves h // g consecutive heads."""
    return t.repeat_interleave(h // t.shape[2], dim=2)


def _gate(y: torch.Tensor, x: torch.Tensor, D: torch.Tensor | None, z: torch.Tensor | None) -> torch.Tensor:
    if D is not None:
        y = y + x * D.to(y.dtype)[:, None]
    if z is not None:
        y = y * F.silu(z.to(y.dtype))
    return y


def ssd_chunked_scan(
    x, dt, A, B, C, chunk_size: int, *, D=None, z=None, dt_bias=None, dt_softplus: bool = False, initial_states=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The SSD chunked scan (module docstring); returns (y [b, l, h, p] in x.dtype, final_state [b, h, p, n])."""
    b, seqlen, h, p, _, n = check_ssd_args(x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias, initial_states=initial_states)
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size: must be an integer >= 1, got {chunk_size!r}")
    f = _compute_dtype(x, dt, A, B, C, D, z, dt_bias, initial_states)
    xf, dtf = x.to(f), discretize_dt(dt.to(f), None if dt_bias is None else dt_bias.to(f), dt_softplus)
    Bh, Ch = _heads(B.to(f), h), _heads(C.to(f), h)
    pad = -seqlen % chunk_size
    c = (seqlen + pad) // chunk_size
    # Padding tokens have dt = 0: decay exp(0) = 1 and input 0, so they leave the state as it is.
    xdt = F.pad(xf * dtf[..., None], (0, 0, 0, 0, 0, pad)).reshape(b, c, chunk_size, h, p)
    Bc = F.pad(Bh, (0, 0, 0, 0, 0, pad)).reshape(b, c, chunk_size, h, n)
    Cc = F.pad(Ch, (0, 0, 0, 0, 0, pad)).reshape(b, c, chunk_size, h, n)
    a = F.pad(dtf * A.to(f), (0, 0, 0, pad)).reshape(b, c, chunk_size, h).permute(0, 3, 1, 2)  # [b, h, c, L]
    a_cumsum = a.cumsum(dim=-1)

    # 1. within each chunk: y_diag[l] = sum_{s <= l} (C_l . B_s) exp(a_{s+1} + ... + a_l) xdt_s
    decay = torch.exp(segsum(a))  # [b, h, c, L, L]
    y_diag = torch.einsum("bclhn,bcshn,bhcls,bcshp->bclhp", Cc, Bc, decay, xdt)
    # 2. the state each chunk builds from its own tokens, at its end
    to_end = torch.exp(a_cumsum[..., -1:] - a_cumsum)  # [b, h, c, L]
    chunk_states = torch.einsum("bclhn,bhcl,bclhp->bchpn", Bc, to_end, xdt)
    # 3. states entering each chunk: initial state, then chunk ends, each decayed across later chunks
    init = torch.zeros(b, h, p, n, dtype=f, device=x.device) if initial_states is None else initial_states.to(f)
    chunk_states = torch.cat([init[:, None], chunk_states], dim=1)  # [b, c+1, h, p, n]
    across = torch.exp(segsum(F.pad(a_cumsum[..., -1], (1, 0))))  # [b, h, c+1, c+1]
    entering = torch.einsum("bhzc,bchpn->bzhpn", across, chunk_states)
    entering, final_state = entering[:, :-1], entering[:, -1]
    # 4. the entering state's contribution to every token of the chunk
    y_off = torch.einsum("bclhn,bchpn,bhcl->bclhp", Cc, entering, torch.exp(a_cumsum))
    y = (y_diag + y_off).reshape(b, c * chunk_size, h, p)[:, :seqlen]
    return _gate(y, xf, None if D is None else D.to(f), z).to(x.dtype), final_state


def ssm_recurrence_sequential(
    x, dt, A, B, C, *, D=None, z=None, dt_bias=None, dt_softplus: bool = False, initial_states=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The plain per-token recurrence (module docstring), always in fp64: the definition the chunked scan is
    checked against. Returns (y [b, l, h, p] fp64, final_state [b, h, p, n] fp64)."""
    b, seqlen, h, p, _, n = check_ssd_args(x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias, initial_states=initial_states)
    f = torch.float64
    xf, Af = x.to(f), A.to(f)
    dtf = discretize_dt(dt.to(f), None if dt_bias is None else dt_bias.to(f), dt_softplus)
    Bh, Ch = _heads(B.to(f), h), _heads(C.to(f), h)
    state = torch.zeros(b, h, p, n, dtype=f, device=x.device) if initial_states is None else initial_states.to(f)
    ys = []
    for t in range(seqlen):
        decay = torch.exp(dtf[:, t] * Af)[..., None, None]  # [b, h, 1, 1]
        state = decay * state + (dtf[:, t, :, None] * xf[:, t])[..., None] * Bh[:, t, :, None, :]
        ys.append(torch.einsum("bhpn,bhn->bhp", state, Ch[:, t]))
    y = torch.stack(ys, dim=1) if ys else xf.new_zeros(b, 0, h, p)
    return _gate(y, xf, None if D is None else D.to(f), None if z is None else z.to(f)), state
