"""A tiny hybrid model: attention and Mamba2 layers, random weights from a fixed seed, pure-torch forward on
the references (reference.mamba: causal conv1d, SSD chunked scan, selective state update).

Architecture (pre-norm residual blocks, no MLP):
    h = embed(tokens)
    for each layer: h = h + mixer(rms_norm(h))           mixer = attention or Mamba2, per `layer_types`
    logits = lm_head(rms_norm(h))
- Attention: q, k, v projections, rotary embedding (rotate-half, optional), causal softmax attention over the
  request's whole KV (the cached tokens, then this step's), output projection.
- Mamba2: in_proj -> [z, xBC, dt]; causal conv1d over xBC with SiLU; x, B, C split from it; SSD with
  A = -exp(A_log), dt_bias, softplus, D, and the SiLU(z) gate applied in the scan (the simple gating; no gated
  RMSNorm); out_proj. Prefill runs `causal_conv1d` + `ssd_chunked_scan` from the request's states, decode
  runs `causal_conv1d_update` + `selective_state_update` on copies of them.

States (`HybridStates`): the token count, then per layer either the attention KV ([B, T, heads, head_dim]
each) or the Mamba conv state [B, conv_kernel - 1, conv_dim] and SSM state [B, heads, head_dim, state_size].
`prefill` and `decode` never mutate the states they are given (decode copies the Mamba states before the
in-place decode references), so saved states stay valid. Everything is fp32, and the attention KV is a plain
list, not the engine's paged cache.
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import torch

from reference.mamba.conv1d import causal_conv1d, causal_conv1d_update
from reference.mamba.ssd import ssd_chunked_scan
from reference.mamba.state_update import selective_state_update
from reference.norm.rms_norm import rms_norm

LAYER_TYPES = ("attention", "mamba")


@dataclasses.dataclass(frozen=True, kw_only=True)
class TinyHybridConfig:
    vocab_size: int = 61
    hidden_size: int = 32
    layer_types: tuple[str, ...] = ("mamba", "attention", "mamba", "attention")
    num_attention_heads: int = 2
    attention_head_dim: int = 16
    rope_theta: float | None = 10_000.0  # None: no rotary embedding
    mamba_num_heads: int = 4
    mamba_head_dim: int = 8
    mamba_n_groups: int = 2
    mamba_state_size: int = 8
    mamba_conv_kernel: int = 4
    mamba_chunk_size: int = 4
    norm_eps: float = 1e-6
    seed: int = 0

    def __post_init__(self) -> None:
        for name in (
            "vocab_size",
            "hidden_size",
            "num_attention_heads",
            "attention_head_dim",
            "mamba_num_heads",
            "mamba_head_dim",
            "mamba_n_groups",
            "mamba_state_size",
            "mamba_chunk_size",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: must be an integer >= 1, got {value!r}")
        if not self.layer_types or any(t not in LAYER_TYPES for t in self.layer_types):
            raise ValueError(f"layer_types: need at least one of {LAYER_TYPES}, got {self.layer_types!r}")
        if self.mamba_num_heads % self.mamba_n_groups:
            raise ValueError(
                f"mamba_n_groups: must divide mamba_num_heads {self.mamba_num_heads}, got {self.mamba_n_groups}"
            )
        if self.mamba_conv_kernel < 2:
            raise ValueError(f"mamba_conv_kernel: must be >= 2, got {self.mamba_conv_kernel}")
        if self.rope_theta is not None and self.attention_head_dim % 2:
            raise ValueError(
                f"attention_head_dim: must be even for the rotary embedding, got {self.attention_head_dim}"
            )

    @property
    def mamba_inner(self) -> int:
        return self.mamba_num_heads * self.mamba_head_dim

    @property
    def mamba_conv_dim(self) -> int:
        return self.mamba_inner + 2 * self.mamba_n_groups * self.mamba_state_size


class AttentionKV(NamedTuple):
    k: torch.Tensor  # [B, T, heads, head_dim]
    v: torch.Tensor


class MambaState(NamedTuple):
    conv: torch.Tensor  # [B, conv_kernel - 1, conv_dim]
    ssm: torch.Tensor  # [B, heads, head_dim, state_size]


class HybridStates(NamedTuple):
    num_tokens: int
    layers: tuple[AttentionKV | MambaState, ...]


def _randn(g: torch.Generator, *shape: int, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, generator=g, dtype=torch.float32) * scale


def _uniform(g: torch.Generator, n: int, lo: float, hi: float) -> torch.Tensor:
    return lo + (hi - lo) * torch.rand(n, generator=g, dtype=torch.float32)


class TinyHybridModel:
    """Weights drawn from `config.seed` (the same config gives bit-identical weights and outputs)."""

    def __init__(self, config: TinyHybridConfig | None = None) -> None:
        self.config = cfg = config or TinyHybridConfig()
        g = torch.Generator().manual_seed(cfg.seed)
        d = cfg.hidden_size
        self.embed = _randn(g, cfg.vocab_size, d)
        self.final_norm = 1.0 + _randn(g, d, scale=0.1)
        self.lm_head = _randn(g, cfg.vocab_size, d, scale=2.0 / math.sqrt(d))
        self.layers = [
            self._attention_weights(g) if t == "attention" else self._mamba_weights(g) for t in cfg.layer_types
        ]

    def _attention_weights(self, g: torch.Generator) -> dict[str, torch.Tensor]:
        cfg, d = self.config, self.config.hidden_size
        inner = cfg.num_attention_heads * cfg.attention_head_dim
        return {
            "norm": 1.0 + _randn(g, d, scale=0.1),
            "wq": _randn(g, inner, d, scale=d**-0.5),
            "wk": _randn(g, inner, d, scale=d**-0.5),
            "wv": _randn(g, inner, d, scale=d**-0.5),
            "wo": _randn(g, d, inner, scale=inner**-0.5),
        }

    def _mamba_weights(self, g: torch.Generator) -> dict[str, torch.Tensor]:
        cfg, d = self.config, self.config.hidden_size
        h = cfg.mamba_num_heads
        dt = _uniform(g, h, math.log(0.05), math.log(0.5)).exp()  # dt after softplus in [0.05, 0.5]
        return {
            "norm": 1.0 + _randn(g, d, scale=0.1),
            "in_proj": _randn(g, cfg.mamba_inner + cfg.mamba_conv_dim + h, d, scale=d**-0.5),
            "conv_weight": _randn(g, cfg.mamba_conv_dim, cfg.mamba_conv_kernel, scale=cfg.mamba_conv_kernel**-0.5),
            "conv_bias": _randn(g, cfg.mamba_conv_dim, scale=0.1),
            "dt_bias": dt + torch.log(-torch.expm1(-dt)),  # inverse softplus
            "A": -_uniform(g, h, 1.0, 4.0),  # A = -exp(A_log), stored already exponentiated
            "D": _randn(g, h),
            "out_proj": _randn(g, d, cfg.mamba_inner, scale=cfg.mamba_inner**-0.5),
        }

    # -- states ---------------------------------------------------------------------------------------------
    def empty_states(self, batch: int) -> HybridStates:
        cfg = self.config
        layers = []
        for t in cfg.layer_types:
            if t == "attention":
                kv = torch.zeros(batch, 0, cfg.num_attention_heads, cfg.attention_head_dim)
                layers.append(AttentionKV(kv, kv.clone()))
            else:
                layers.append(
                    MambaState(
                        torch.zeros(batch, cfg.mamba_conv_kernel - 1, cfg.mamba_conv_dim),
                        torch.zeros(batch, cfg.mamba_num_heads, cfg.mamba_head_dim, cfg.mamba_state_size),
                    )
                )
        return HybridStates(0, tuple(layers))

    def _check_states(self, states: HybridStates | None, batch: int) -> HybridStates:
        if states is None:
            return self.empty_states(batch)
        if not isinstance(states, HybridStates) or len(states.layers) != len(self.layers):
            raise TypeError(f"states: must be HybridStates with {len(self.layers)} layers")
        for i, (t, s) in enumerate(zip(self.config.layer_types, states.layers, strict=True)):
            kind = AttentionKV if t == "attention" else MambaState
            if not isinstance(s, kind) or s[0].shape[0] != batch:
                raise ValueError(f"states: layer {i} must be a {kind.__name__} for batch {batch}")
            if t == "attention" and s.k.shape[1] != states.num_tokens:
                raise ValueError(
                    f"states: layer {i} holds KV of {s.k.shape[1]} tokens, num_tokens is {states.num_tokens}"
                )
        return states

    # -- mixers ---------------------------------------------------------------------------------------------
    def _rope(self, x: torch.Tensor, start: int) -> torch.Tensor:
        cfg = self.config
        if cfg.rope_theta is None:
            return x
        half = cfg.attention_head_dim // 2
        inv_freq = cfg.rope_theta ** (-torch.arange(half, dtype=torch.float32) / half)
        angle = torch.arange(start, start + x.shape[1], dtype=torch.float32)[:, None] * inv_freq  # [L, half]
        cos, sin = angle.cos()[None, :, None, :], angle.sin()[None, :, None, :]
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)

    def _attention(self, w, u: torch.Tensor, kv: AttentionKV, start: int) -> tuple[torch.Tensor, AttentionKV]:
        cfg = self.config
        b, length, _ = u.shape
        shape = (b, length, cfg.num_attention_heads, cfg.attention_head_dim)
        q = self._rope((u @ w["wq"].T).view(shape), start)
        k = torch.cat([kv.k, self._rope((u @ w["wk"].T).view(shape), start)], dim=1)
        v = torch.cat([kv.v, (u @ w["wv"].T).view(shape)], dim=1)
        scores = torch.einsum("blhd,bthd->bhlt", q, k) * cfg.attention_head_dim**-0.5
        future = torch.arange(k.shape[1])[None, :] > torch.arange(start, start + length)[:, None]
        probs = scores.masked_fill(future, -torch.inf).softmax(dim=-1)
        out = torch.einsum("bhlt,bthd->blhd", probs, v).reshape(b, length, -1)
        return out @ w["wo"].T, AttentionKV(k, v)

    def _mamba_split(self, w, u: torch.Tensor):
        cfg = self.config
        zxbcdt = u @ w["in_proj"].T
        return torch.split(zxbcdt, [cfg.mamba_inner, cfg.mamba_conv_dim, cfg.mamba_num_heads], dim=-1)

    def _xbc(self, xbc: torch.Tensor):
        cfg = self.config
        gn = cfg.mamba_n_groups * cfg.mamba_state_size
        x, B, C = torch.split(xbc, [cfg.mamba_inner, gn, gn], dim=-1)
        lead = xbc.shape[:-1]
        return (
            x.reshape(*lead, cfg.mamba_num_heads, cfg.mamba_head_dim),
            B.reshape(*lead, cfg.mamba_n_groups, cfg.mamba_state_size),
            C.reshape(*lead, cfg.mamba_n_groups, cfg.mamba_state_size),
        )

    def _mamba_prefill(self, w, u: torch.Tensor, state: MambaState) -> tuple[torch.Tensor, MambaState]:
        cfg = self.config
        z, xbc, dt = self._mamba_split(w, u)
        xbc, conv = causal_conv1d(xbc, w["conv_weight"], w["conv_bias"], initial_state=state.conv, activation="silu")
        x, B, C = self._xbc(xbc)
        y, ssm = ssd_chunked_scan(
            x,
            dt,
            w["A"],
            B,
            C,
            cfg.mamba_chunk_size,
            D=w["D"],
            z=z.reshape(x.shape),
            dt_bias=w["dt_bias"],
            dt_softplus=True,
            initial_states=state.ssm,
        )
        return y.reshape(*u.shape[:2], -1) @ w["out_proj"].T, MambaState(conv, ssm)

    def _mamba_decode(self, w, u: torch.Tensor, state: MambaState) -> tuple[torch.Tensor, MambaState]:
        z, xbc, dt = self._mamba_split(w, u)  # u: [B, hidden]
        conv, ssm = state.conv.clone(), state.ssm.clone()
        xbc = causal_conv1d_update(xbc, conv, w["conv_weight"], w["conv_bias"], activation="silu")
        x, B, C = self._xbc(xbc)
        y = selective_state_update(
            ssm, x, dt, w["A"], B, C, D=w["D"], z=z.reshape(x.shape), dt_bias=w["dt_bias"], dt_softplus=True
        )
        return y.reshape(u.shape[0], -1) @ w["out_proj"].T, MambaState(conv, ssm)

    # -- forward --------------------------------------------------------------------------------------------
    def _check_tokens(self, name: str, tokens: torch.Tensor, dims: int) -> None:
        if not isinstance(tokens, torch.Tensor) or tokens.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"{name}: must be an int32/int64 tensor, got {getattr(tokens, 'dtype', type(tokens))}")
        if tokens.dim() != dims or tokens.shape[-1] == 0:
            raise ValueError(f"{name}: must be {dims}-D and non-empty, got shape {tuple(tokens.shape)}")
        if tokens.numel() and not 0 <= int(tokens.min()) <= int(tokens.max()) < self.config.vocab_size:
            raise ValueError(f"{name}: ids must be in [0, {self.config.vocab_size})")

    def prefill(self, tokens: torch.Tensor, states: HybridStates | None = None) -> tuple[torch.Tensor, HybridStates]:
        """tokens [B, L] after `states` (None: from the start) -> (logits [B, L, vocab], states after them)."""
        self._check_tokens("tokens", tokens, 2)
        states = self._check_states(states, tokens.shape[0])
        h = self.embed[tokens]
        new = []
        for t, w, s in zip(self.config.layer_types, self.layers, states.layers, strict=True):
            u = rms_norm(h, w["norm"], self.config.norm_eps)
            out, s = self._attention(w, u, s, states.num_tokens) if t == "attention" else self._mamba_prefill(w, u, s)
            h = h + out
            new.append(s)
        logits = rms_norm(h, self.final_norm, self.config.norm_eps) @ self.lm_head.T
        return logits, HybridStates(states.num_tokens + tokens.shape[1], tuple(new))

    def decode(self, token: torch.Tensor, states: HybridStates) -> tuple[torch.Tensor, HybridStates]:
        """One token per request, token [B], after `states` -> (logits [B, vocab], states after it)."""
        self._check_tokens("token", token, 1)
        states = self._check_states(states, token.shape[0])
        h = self.embed[token]
        new = []
        for t, w, s in zip(self.config.layer_types, self.layers, states.layers, strict=True):
            u = rms_norm(h, w["norm"], self.config.norm_eps)
            if t == "attention":
                out, s = self._attention(w, u[:, None], s, states.num_tokens)
                out = out[:, 0]
            else:
                out, s = self._mamba_decode(w, u, s)
            h = h + out
            new.append(s)
        logits = rms_norm(h, self.final_norm, self.config.norm_eps) @ self.lm_head.T
        return logits, HybridStates(states.num_tokens + 1, tuple(new))


def greedy_decode(
    model: TinyHybridModel, last_logits: torch.Tensor, states: HybridStates, max_new_tokens: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy continuation after a prefill whose last-position logits are `last_logits` [B, vocab]: returns
    (tokens [B, max_new_tokens], the logits each token was chosen from [B, max_new_tokens, vocab])."""
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens: must be an integer >= 1, got {max_new_tokens!r}")
    tokens, logits = [], [last_logits]
    for i in range(max_new_tokens):
        tokens.append(logits[-1].argmax(dim=-1))
        if i + 1 < max_new_tokens:
            step, states = model.decode(tokens[-1], states)
            logits.append(step)
    return torch.stack(tokens, dim=1), torch.stack(logits, dim=1)


def generate(model: TinyHybridModel, prompt: torch.Tensor, max_new_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy generation: prefill the prompt [B, L] in one step, then decode; see `greedy_decode`."""
    logits, states = model.prefill(prompt)
    return greedy_decode(model, logits[:, -1], states, max_new_tokens)
