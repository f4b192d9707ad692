"""The Llama building blocks: RMSNorm, rotary embedding, SiLU-and-mul, linear layers whose parameters carry
a `weight_loader`, and the fused QKV and gate/up projections filled shard by shard.

Fused projections (as vLLM's QKVParallelLinear and MergedColumnParallelLinear): one GEMM computes q, k and v
(or gate and up) from a single weight whose rows are the shards stacked in a fixed order. The checkpoint stores
the shards as separate tensors; `weight_loader(param, tensor, shard_id)` copies each into its own row slice of
the parameter, in place: the fused tensor is allocated once, with the model, and never rebuilt or copied after
loading.

Numerics follow HF transformers' Llama (what the parity test compares against): RMSNorm in fp32 then rounded
to the input dtype before the weight multiplies; RoPE frequencies inv_freq = 1 / base^(2i/d) in fp32, angles
position * inv_freq in fp32, "rotate half" pairing (dim i with i + d/2); the rotation itself is computed in
fp32 and rounded once (HF rounds cos/sin and each product to the activation dtype: the same bits in fp32,
an ulp apart on some bf16 outputs).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from reference.norm.rms_norm import rms_norm
from reference.rotary.rope import apply_rope, rope_cos_sin_cache
from runner.model.attention import uses_kernels
from runner.model.quant.activation import GROUP, Fp8Groups


def default_weight_loader(param: nn.Parameter, tensor: torch.Tensor) -> None:
    """Copy a checkpoint tensor into a parameter of the same shape (any dtype/device: converted on copy)."""
    if tuple(tensor.shape) != tuple(param.shape):
        raise ValueError(
            f"weight: checkpoint tensor of shape {tuple(tensor.shape)} does not fit the parameter's "
            f"{tuple(param.shape)}"
        )
    param.data.copy_(tensor)


def _param(shape: tuple[int, ...], dtype: torch.dtype, device, loader=default_weight_loader) -> nn.Parameter:
    p = nn.Parameter(torch.empty(shape, dtype=dtype, device=device), requires_grad=False)
    p.weight_loader = loader
    return p


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float, dtype: torch.dtype, device) -> None:
        super().__init__()
        self.eps = eps
        self.weight = _param((size,), dtype, device)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None, fp8_groups: bool = False):
        """norm(x), or with `residual` (norm(x + residual), x + residual): the residual add fused into the norm
        (one rounding of the sum either way, so the unfused and fused forms give the same bits). On the GPU
        in bf16/fp16 this is the Triton kernel (one launch instead of ~8 torch ops: at SmolLM2's decode step,
        60 norm sites a step); elsewhere the reference it is checked against. `fp8_groups` (the caller checked
        `wants_fp8_groups`): the norm comes back as Fp8Groups for a block-FP8 GEMM, quantized in the same launch."""
        if not (fp8_groups or uses_kernels(x)):
            return rms_norm(x, self.weight, self.eps, residual)
        from kernels.rms_norm import launch_rms_norm  # the launcher, not the op: runner.model.attention says why

        out = launch_rms_norm(x, self.weight, self.eps, residual, fp8_groups=fp8_groups)
        if not fp8_groups:
            return out
        if residual is None:
            return Fp8Groups(*out, x.dtype)
        return Fp8Groups(*out[0], x.dtype), out[1]


class RotaryEmbedding(nn.Module):
    """Rotate q [T, Hq, D] and k [T, Hkv, D] by their tokens' positions [T] (int64), HF-Llama "rotate half"
    pairing, from one fp32 cos/sin table of `max_positions` rows built with the model (HF's op order: its rows
    equal transformers' LlamaRotaryEmbedding cos/sin bit for bit, suites/rotary). On the GPU in bf16/fp16: the
    Triton kernel, in place on q and k (views of the fused qkv output), one launch a layer where the eager
    rotate-half sequence took ~10 (0.7 ms of a 5.6 ms W1 decode step on the H200); elsewhere the reference:
    fp32 products, rounded once (for fp32 activations: HF's result bit for bit)."""

    def __init__(self, head_dim: int, base: float, max_positions: int, device) -> None:
        super().__init__()
        self.register_buffer(
            "cos_sin_cache", rope_cos_sin_cache(head_dim, base, max_positions, device=device), persistent=False
        )

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if uses_kernels(q):  # the launcher, not the op: runner.model.attention says why
            from kernels.rope import launch_rope

            launch_rope(q, k, positions, self.cos_sin_cache)
            return q, k
        return apply_rope(q, k, positions, self.cos_sin_cache)


class SiluAndMul(nn.Module):
    """[T, 2I] -> silu(first half) * second half, [T, I]. On the GPU in bf16/fp16 the Triton kernel (one
    launch; the eager form below is two, and rounds the silu once more); with `fp8_groups` (the caller checked
    `wants_fp8_groups`) its output comes back as Fp8Groups for a block-FP8 GEMM, quantized in the same launch."""

    def forward(self, x: torch.Tensor, fp8_groups: bool = False) -> torch.Tensor | Fp8Groups:
        if uses_kernels(x):  # the launcher, not the op: runner.model.attention says why
            from kernels.silu_and_mul import launch_silu_and_mul

            if fp8_groups:
                return Fp8Groups(*launch_silu_and_mul(x, GROUP), x.dtype)
            return launch_silu_and_mul(x)
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up


class Linear(nn.Module):
    """y = x W^T, W [out, in], no bias; how W is stored and multiplied is the layer's quantization scheme
    (runner.model.quant: unquantized unless one is given). The output rows are named shards stacked in order
    (one unnamed shard for a plain layer); the checkpoint gives each shard on its own, and `weight_loader`
    copies it into its row slice of every row-sharded parameter."""

    def __init__(self, in_features: int, out_features: int | dict, dtype: torch.dtype, device, scheme=None) -> None:
        super().__init__()
        from runner.model.quant.unquantized import Unquantized

        shards = out_features if isinstance(out_features, dict) else {None: out_features}
        self.in_features, self.out_features = in_features, sum(shards.values())
        self.dtype, self.device = dtype, torch.device(device)
        self.shard_sizes = dict(shards)
        self.shard_offsets, offset = {}, 0
        for shard_id, size in shards.items():
            self.shard_offsets[shard_id] = offset
            offset += size
        self.scheme = scheme if scheme is not None else Unquantized()
        self.staging: torch.Tensor | None = None  # an online scheme's unquantized weight while it loads
        self.loaded_rows = 0
        self.processed = False
        self.scheme.create_weights(self)

    def new_param(
        self,
        shape: tuple[int, ...],
        dtype: torch.dtype,
        device=None,
        row_block: int = 1,
        exact_dtype: bool = False,
        per_shard: bool = False,
    ) -> nn.Parameter:
        """A parameter of the layer filled through `weight_loader`: its row r covers output rows
        [r * row_block, (r + 1) * row_block) (a scale per 128-row tile: row_block 128); per_shard: one scalar
        per shard, in shard order (a checkpoint part's own scale). exact_dtype: a checkpoint tensor of another
        dtype is refused (quantized codes and scales), not converted."""
        p = nn.Parameter(torch.empty(shape, dtype=dtype, device=device or self.device), requires_grad=False)
        p.weight_loader, p.row_block, p.exact_dtype, p.per_shard = self.weight_loader, row_block, exact_dtype, per_shard
        return p

    def weight_loader(self, param: nn.Parameter, tensor: torch.Tensor, shard_id: str | int | None = None) -> None:
        """Copy `tensor` [shard rows, in] into the shard's row slice of `param`, in place (an online scheme:
        of the layer's staging weight, quantized once its last row is in)."""
        if shard_id not in self.shard_sizes:
            raise ValueError(f"shard_id: must be one of {list(self.shard_sizes)}, got {shard_id!r}")
        what = "checkpoint tensor" if shard_id is None else f"shard {shard_id!r}"
        if getattr(param, "per_shard", False):
            if tensor.numel() != 1:
                raise ValueError(f"{what} must be a scalar, got shape {list(tensor.shape)}")
            param.data[list(self.shard_sizes).index(shard_id)] = tensor.reshape(()).to(param.dtype)
            return
        block = getattr(param, "row_block", 1)
        rows, offset = -(-self.shard_sizes[shard_id] // block), self.shard_offsets[shard_id] // block
        if tuple(tensor.shape) != (rows, *param.shape[1:]):
            raise ValueError(f"{what} must be {[rows, *param.shape[1:]]}, got {list(tensor.shape)}")
        if getattr(param, "exact_dtype", False) and tensor.dtype != param.dtype:
            raise ValueError(f"{what} must be {param.dtype} for the {self.scheme.name} scheme, got {tensor.dtype}")
        if not self.scheme.online:
            param.data.narrow(0, offset, rows).copy_(tensor)
            return
        if self.staging is None:
            self.staging = torch.empty(tuple(param.shape), dtype=self.dtype, device=self.device)
        self.staging.narrow(0, self.shard_offsets[shard_id], rows).copy_(tensor)
        self.loaded_rows += rows
        if self.loaded_rows == self.out_features:
            self.process_weights_after_loading()

    def take_staging(self) -> torch.Tensor:
        w, self.staging = self.staging, None
        if w is None:
            raise RuntimeError("process_weights_after_loading: no weight was loaded into this layer")
        return w

    def process_weights_after_loading(self) -> None:
        """Once: the scheme turns the loaded tensors into what `forward` reads."""
        if self.processed:
            raise RuntimeError(f"process_weights_after_loading: the {self.scheme.name} layer was processed already")
        self.scheme.process_weights_after_loading(self)
        self.processed = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scheme.apply(self, x)

    def split(self, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The output's shards along the last dim (views)."""
        return y.split(list(self.shard_sizes.values()), dim=-1)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, scheme={self.scheme.describe()}"


class FusedLinear(Linear):
    """A linear layer whose output rows are named shards, stacked in order; each shard is loaded on its own."""

    def __init__(self, in_features: int, shards: dict[str | int, int], dtype: torch.dtype, device, scheme=None):
        super().__init__(in_features, shards, dtype, device, scheme)


class QKVLinear(FusedLinear):
    """Shards "q" (Hq * D rows), "k" and "v" (Hkv * D rows each)."""

    def __init__(
        self, hidden: int, head_dim: int, num_heads: int, num_kv_heads: int, dtype, device, scheme=None
    ) -> None:
        super().__init__(
            hidden,
            {"q": num_heads * head_dim, "k": num_kv_heads * head_dim, "v": num_kv_heads * head_dim},
            dtype,
            device,
            scheme,
        )


class GateUpLinear(FusedLinear):
    """Shards 0 (gate) and 1 (up), `intermediate` rows each; SiluAndMul takes its output as is."""

    def __init__(self, hidden: int, intermediate: int, dtype, device, scheme=None) -> None:
        super().__init__(hidden, {0: intermediate, 1: intermediate}, dtype, device, scheme)


class Embedding(nn.Module):
    def __init__(self, vocab: int, hidden: int, dtype: torch.dtype, device) -> None:
        super().__init__()
        self.weight = _param((vocab, hidden), dtype, device)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.weight)
