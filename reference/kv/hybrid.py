"""Hybrid page unification: attention and Mamba (recurrent-state) layers share one block pool, so every
layer's page must be the same number of bytes (vLLM `Platform._align_hybrid_block_size`,
`unify_kv_cache_spec_page_size`).

A Mamba page holds one request's whole state (conv state + SSM state), whatever the block size:
    mamba_page = sum(prod(shape) * dtype_size)
Attention's page grows with its block size, so the attention block size is raised to
    attn_block = alignment * ceil(mamba_page / (alignment * attn_token_bytes))
(`alignment` is the attention kernel's block alignment, or in vLLM's prefix-caching "all" mode
lcm(mamba chunk size, kernel alignment)), never lowered, and the Mamba page is then padded to the attention
page (attn_block * attn_token_bytes, or that rounded up to the spec's alignment for DeepSeek-V4 pages).
`unify_page_sizes` is the general rule over many specs: the largest page wins; a smaller attention page grows
its block size by the whole ratio when that lands exactly on it, else is padded (one-part blocks only); a
Mamba page is padded.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from reference.kv.spec import CacheSpec, check_count


@dataclasses.dataclass(frozen=True, kw_only=True)
class MambaSpec:
    """Recurrent state of one layer: one tensor per shape (e.g. conv state, SSM state), all in one page."""

    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[torch.dtype, ...]
    page_bytes_padded: int | None = None

    def __post_init__(self) -> None:
        if not self.shapes or len(self.shapes) != len(self.dtypes):
            raise ValueError(
                f"shapes: need one shape per dtype, got {len(self.shapes)} shapes, {len(self.dtypes)} dtypes"
            )
        for shape in self.shapes:
            for dim in shape:
                check_count("shapes", dim)
        if self.page_bytes_padded is not None and (
            isinstance(self.page_bytes_padded, bool) or self.page_bytes_padded < self.real_page_bytes
        ):
            raise ValueError(
                f"page_bytes_padded: must be at least the real page {self.real_page_bytes} bytes, got "
                f"{self.page_bytes_padded}"
            )

    @property
    def real_page_bytes(self) -> int:
        return sum(math.prod(s) * d.itemsize for s, d in zip(self.shapes, self.dtypes, strict=True))

    @property
    def page_bytes(self) -> int:
        return self.real_page_bytes if self.page_bytes_padded is None else self.page_bytes_padded

    def with_page_bytes(self, page_bytes: int) -> MambaSpec:
        return dataclasses.replace(self, page_bytes_padded=page_bytes)


def _extra_groups_for_head_shards(n_groups: int, tp: int) -> int:
    # Groups are replicated so that every tensor-parallel head shard carries its group; vLLM's
    # mixer allows only n_groups % tp == 0 or a single group (replicated tp times).
    if n_groups % tp and n_groups != 1:
        raise ValueError(f"n_groups: must divide by tp={tp} or be 1, got {n_groups}")
    return 0 if n_groups % tp == 0 else tp - n_groups


def _check_shards(tp: int, **heads: int) -> None:
    for name, value in heads.items():
        if value % tp:
            raise ValueError(f"{name}: must divide by tp={tp}, got {value}")


def mamba2_state_shapes(
    *,
    intermediate_size: int,
    n_groups: int,
    num_heads: int,
    head_dim: int,
    state_size: int,
    conv_kernel: int,
    tp: int = 1,
) -> tuple[tuple[int, int], tuple[int, int, int]]:
    """Mamba2: conv state (conv_kernel - 1, conv_dim // tp) in vLLM's default "SD" order, conv_dim =
    intermediate_size + 2 * n_groups * state_size; SSM state (num_heads // tp, head_dim, state_size)."""
    for name, value in (
        ("intermediate_size", intermediate_size),
        ("n_groups", n_groups),
        ("num_heads", num_heads),
        ("head_dim", head_dim),
        ("state_size", state_size),
        ("conv_kernel", conv_kernel),
        ("tp", tp),
    ):
        check_count(name, value)
    _check_shards(tp, num_heads=num_heads, intermediate_size=intermediate_size)
    n_groups += _extra_groups_for_head_shards(n_groups, tp)
    conv_dim = intermediate_size + 2 * n_groups * state_size
    return (conv_kernel - 1, conv_dim // tp), (num_heads // tp, head_dim, state_size)


def gated_delta_net_state_shapes(
    *, num_k_heads: int, num_v_heads: int, head_k_dim: int, head_v_dim: int, conv_kernel: int, tp: int = 1
) -> tuple[tuple[int, int], tuple[int, int, int]]:
    """Gated DeltaNet (Qwen3-Next/3.5 linear attention): conv state (conv_kernel - 1, conv_dim // tp), conv_dim =
    2 * num_k_heads * head_k_dim + num_v_heads * head_v_dim; state (num_v_heads // tp, head_v_dim, head_k_dim)."""
    for name, value in (
        ("num_k_heads", num_k_heads),
        ("num_v_heads", num_v_heads),
        ("head_k_dim", head_k_dim),
        ("head_v_dim", head_v_dim),
        ("conv_kernel", conv_kernel),
        ("tp", tp),
    ):
        check_count(name, value)
    _check_shards(tp, num_k_heads=num_k_heads, num_v_heads=num_v_heads)
    conv_dim = 2 * num_k_heads * head_k_dim + num_v_heads * head_v_dim
    return (conv_kernel - 1, conv_dim // tp), (num_v_heads // tp, head_v_dim, head_k_dim)


def hybrid_attention_block_size(attn_token_bytes: int, mamba_page_bytes: int, alignment: int) -> int:
    """The smallest multiple of `alignment` tokens whose attention page holds a Mamba page."""
    check_count("attn_token_bytes", attn_token_bytes)
    check_count("mamba_page_bytes", mamba_page_bytes)
    check_count("alignment", alignment)
    return alignment * -(-mamba_page_bytes // (alignment * attn_token_bytes))


def unify_attention_mamba(attention: CacheSpec, mamba: MambaSpec, alignment: int) -> tuple[CacheSpec, MambaSpec]:
    """Raise the attention block size until its page holds the Mamba page, then pad the Mamba page to it."""
    if not isinstance(attention, CacheSpec):
        raise TypeError(f"attention: must be a CacheSpec, got {type(attention).__name__}")
    if not isinstance(mamba, MambaSpec):
        raise TypeError(f"mamba: must be a MambaSpec, got {type(mamba).__name__}")
    needed = hybrid_attention_block_size(attention.token_bytes, mamba.real_page_bytes, alignment)
    if attention.block_size < needed:
        attention = attention.with_block_size(needed)
    if attention.page_bytes < mamba.real_page_bytes:
        raise ValueError(
            f"attention: its padded page of {attention.page_bytes} bytes at block size "
            f"{attention.block_size} cannot hold the {mamba.real_page_bytes}-byte Mamba page"
        )
    return attention, mamba.with_page_bytes(attention.page_bytes)


def unify_page_sizes(specs: dict[str, CacheSpec | MambaSpec]) -> dict[str, CacheSpec | MambaSpec]:
    """Give every spec the largest page of `specs` (names are layer or group names, kept in the result)."""
    if not specs:
        raise ValueError("specs: need at least one spec")
    target = max(spec.page_bytes for spec in specs.values())
    out = {}
    for name, spec in specs.items():
        if spec.page_bytes == target:
            out[name] = spec
        elif isinstance(spec, MambaSpec):
            out[name] = spec.with_page_bytes(target)
        else:
            out[name] = _grow_or_pad(name, spec, target)
    return out


def _grow_or_pad(name: str, spec: CacheSpec, target: int) -> CacheSpec:
    if spec.page_bytes_padded is None and target % spec.page_bytes == 0:
        grown = spec.with_block_size(spec.block_size * (target // spec.page_bytes))
        if grown.page_bytes == target:
            return grown
    if len(spec.part_spans()) == 1 and target % spec.alignment == 0:
        return spec.with_page_bytes(target)
    raise ValueError(
        f"specs: {name!r} (page {spec.page_bytes} bytes) can neither grow its block size nor be padded "
        f"to the common page of {target} bytes"
    )
