"""The sparse mixture-of-experts MLP of a Mixtral or Qwen3-MoE decoder layer (HF `block_sparse_moe` / `mlp`).

    logits = x @ gate^T;  (w, ids) = the top-k of softmax(logits) in fp32, renormalized for Mixtral and for
    Qwen3-MoE with norm_topk_prob (`reference.moe.routing.softmax_topk`)
    out[t] = sum_j w[t, j] * down_e(silu(gate_e x[t]) * up_e x[t]),  e = ids[t, j]

Weights: the experts' gate and up projections (checkpoint `experts.<e>.w1` and `.w3`, Qwen3's `.gate_proj` and
`.up_proj`) fused into `w13` [E, 2I, H], gate rows first, and the down projections (`.w2`, `.down_proj`)
stacked in `w2` [E, H, I]: the layout of
`reference.moe.experts` and `kernels.fused_moe`. A checkpoint gives each expert's matrix on its own;
`weight_loader` copies it into its slice, with the shard id (expert, "w1" | "w2" | "w3").
On CUDA in bf16/fp16 the experts run as `kernels.fused_moe` (through its launcher, as the runner's other
kernels: runner.model.attention); elsewhere as `reference.moe.experts.fused_moe_mirror` (on the input's device:
fp32 GEMMs, a fp32 sum over the k experts). With online MXFP4 (`quantization="mxfp4"`) each expert is quantized
as its last matrix arrives (`quantize_experts`): a load holds the quantized experts and the unquantized matrices of
the experts still arriving (one, in a checkpoint that keeps an expert's tensors together, as safetensors' sorted
names do), never the layer's unquantized experts; the `w13` and `w2` parameters stay shapes without storage (the
meta device) that the loader names. Once all are in, `store_experts` stores them in the layout the device reads: on
CUDA in bf16
where the packed PTX runs (NVIDIA sm_90+) and H and the padded I are multiples of 64, the fragment layout
(`kernels.mxfp4_fragment_layout`), run as `kernels.mxfp4_moe_fragment` (tensor-core GEMVs at decode, the bf16 layer
on the decoded experts at prefill); elsewhere codes and scales, run as `kernels.mxfp4_moe` on CUDA in bf16,
`reference.moe.quantized.mxfp4_moe_mirror` otherwise.

A block-FP8 checkpoint's experts (HF fine-grained FP8: each matrix E4M3 with an fp32 scale per 128 x 128 tile,
`weight_scale_inv`; compressed-tensors names it `weight_scale`) load as they are into w13 / w2 and their tile scales
(w1's tiles then w3's: I must fill whole tiles, and H and I are the GEMMs' K, whole blocks) and run as
`kernels.block_fp8_moe` on CUDA in bf16/fp16 (activations quantized per token and 128-wide group inside the op),
`reference.moe.quantized.block_fp8_moe_mirror` elsewhere. An MXFP4 checkpoint's experts (AMD Quark's W4A16 layout:
`weight` uint8 codes [N, K / 2], E8M0 `weight_scale` [N, K / 32]; compressed-tensors' MXFP4A16 the same bytes with
the codes named `weight_packed`; I a multiple of 32) load as they are (-0 codes stored as +0, a 0xFF scale refused)
and are stored and run as the online MXFP4 experts are.
"""

from __future__ import annotations

import re

import torch
import torch.nn.functional as F
from torch import nn

from reference.gemm.block_fp8 import BLOCK as FP8_BLOCK
from reference.moe import experts as moe_reference
from reference.moe.quantized import block_fp8_moe_mirror, mxfp4_moe_mirror
from reference.moe.routing import softmax_topk
from reference.quant.mxfp4 import MX_BLOCK_SIZE
from runner.model.quant.mxfp4 import check_e8m0_scales, positive_zeros, quantize_weight
from runner.model.quant.scheme import kernels_run_on

# checkpoint name of one expert's matrix or its block scales -> (module prefix, expert, part, tensor): Mixtral's
# w1/w2/w3, Qwen3-MoE's gate_proj/down_proj/up_proj (EXPERT_PART gives the part as w1/w2/w3); the tensor is the
# matrix (CODES: "weight", or compressed-tensors' "weight_packed" FP4 codes) or a quantized checkpoint's scale name
# (`expert_param` gives the parameter it loads into)
EXPERT_TENSOR = re.compile(
    r"^(.*)\.experts\.(\d+)\.(w1|w2|w3|gate_proj|up_proj|down_proj)\."
    r"(weight|weight_packed|weight_scale_inv|weight_scale)$"
)
CODES = ("weight", "weight_packed")
EXPERT_PART = {"w1": "w1", "w2": "w2", "w3": "w3", "gate_proj": "w1", "down_proj": "w2", "up_proj": "w3"}


# a quantized checkpoint's expert schemes SparseMoE takes -> the scheme's own name of its scale tensor (a producer
# may rename it: the scheme's `tensor_name`)
CHECKPOINT_SCALE = {"fp8_block": "weight_scale_inv", "mxfp4": "weight_scale"}


def expert_param(matrix: str, tensor: str) -> str:
    """The SparseMoE parameter a checkpoint's expert tensor loads into: `matrix` "w13" or "w2", `tensor` one of
    CODES (the matrix itself) or a quantized checkpoint's scale name (w13_weight_scale_inv, w2_weight_scale, ...)."""
    return matrix if tensor in CODES else f"{matrix}_{tensor}"


class SparseMoE(nn.Module):
    def __init__(
        self, hidden: int, inter: int, experts: int, top_k: int, renormalize: bool, dtype: torch.dtype, device,
        mxfp4: bool = False, checkpoint: tuple[str, str] | None = None,
    ) -> None:  # fmt: skip
        """mxfp4: quantize each expert to MXFP4 as it is loaded (online); checkpoint: (scheme, scale tensor name) of a
        quantized checkpoint's experts, "fp8_block" or "mxfp4" (module doc)."""
        super().__init__()
        self.hidden, self.inter, self.num_experts, self.top_k = hidden, inter, experts, top_k
        self.renormalize, self.online_mxfp4 = renormalize, mxfp4
        self.dtype, self.device = dtype, torch.device(device)
        self.checkpoint = checkpoint[0] if checkpoint else None
        self.mxfp4 = mxfp4 or self.checkpoint == "mxfp4"  # the experts run as MXFP4 once loaded
        self.scale_params: tuple[str, str] | None = None  # a checkpoint's w13 and w2 scale parameters' names
        if self.mxfp4:
            check_mxfp4_hidden(hidden)
        self.gate = nn.Module()  # HF's name: `block_sparse_moe.gate.weight`, the router
        self.gate.weight = self._param((experts, hidden), dtype, device)
        experts_device = "meta" if mxfp4 else device
        shapes = ((experts, 2 * inter, hidden), (experts, hidden, inter))
        codes, scale_shapes, scale_dtype = dtype, None, None
        if self.checkpoint == "fp8_block":
            check_fp8_block_sizes(hidden, inter)
            codes, scale_dtype = torch.float8_e4m3fn, torch.float32
            scale_shapes = tuple((e, -(-n // FP8_BLOCK), k // FP8_BLOCK) for e, n, k in shapes)
        elif self.checkpoint == "mxfp4":
            check_mxfp4_inter(inter)
            codes, scale_dtype = torch.uint8, torch.uint8
            scale_shapes = tuple((e, n, k // MX_BLOCK_SIZE) for e, n, k in shapes)
            shapes = tuple((e, n, k // 2) for e, n, k in shapes)
        elif self.checkpoint is not None:
            raise ValueError(f"checkpoint: must be one of {sorted(CHECKPOINT_SCALE)}, got {self.checkpoint!r}")
        self.w13 = self._param(shapes[0], codes, experts_device, ("w1", "w3"))
        self.w2 = self._param(shapes[1], codes, experts_device, ("w2",))
        if checkpoint:
            self.scale_params = (expert_param("w13", checkpoint[1]), expert_param("w2", checkpoint[1]))
            setattr(self, self.scale_params[0], self._param(scale_shapes[0], scale_dtype, device, ("w1", "w3")))
            setattr(self, self.scale_params[1], self._param(scale_shapes[1], scale_dtype, device, ("w2",)))
        self.staged: dict[int, dict[str, torch.Tensor]] = {}  # online MXFP4: an arriving expert's matrices by part
        self.quantized: dict[str, torch.Tensor] | None = None  # online MXFP4: the experts quantized so far
        self.quantized_experts: set[int] = set()

    def _param(self, shape, dtype, device, parts: tuple[str, ...] = ()) -> nn.Parameter:
        """A parameter filled by `weight_loader`; `parts`: an expert parameter's parts (w1 and w3 stacked in its
        rows, or w2), whose shard ids load_weights must see before it is complete."""
        p = nn.Parameter(torch.empty(shape, dtype=dtype, device=device), requires_grad=False)
        p.weight_loader = self.weight_loader
        if parts:
            p.expert_shards = [(e, part) for e in range(self.num_experts) for part in parts]
        return p

    def weight_loader(self, param: nn.Parameter, tensor: torch.Tensor, shard_id=None) -> None:
        if shard_id is None:  # the router
            if tuple(tensor.shape) != tuple(param.shape):
                raise ValueError(f"checkpoint tensor must be {list(param.shape)}, got {list(tensor.shape)}")
            if tensor.dtype.itemsize == 1:
                raise ValueError(f"the router loads unquantized, got {tensor.dtype}")
            param.data.copy_(tensor)
            return
        expert, part = shard_id
        if not 0 <= expert < self.num_experts:
            raise ValueError(f"expert {expert} does not exist: this layer has {self.num_experts}")
        half = param.shape[1] // 2  # w13's rows (or its tile rows): w1's, then w3's
        rows = {"w1": slice(0, half), "w3": slice(half, 2 * half)}.get(part, slice(None))
        target = param.data[expert, rows]
        if tuple(tensor.shape) != tuple(target.shape):
            raise ValueError(f"expert {expert} {part} must be {list(target.shape)}, got {list(tensor.shape)}")
        if self.checkpoint and tensor.dtype != param.dtype:  # a checkpoint's codes and scales are taken as they are
            raise ValueError(f"expert {expert} {part} must be {param.dtype} ({self.checkpoint}), got {tensor.dtype}")
        if self.online_mxfp4:
            self._stage(expert, part, tensor)
        else:
            target.copy_(tensor)

    def _stage(self, expert: int, part: str, tensor: torch.Tensor) -> None:
        """Online MXFP4: keep the expert's matrix until its three are in, then quantize the expert (`quantize_experts`
        of its gate rows then up rows, and its w2) into its slot of `quantized` and drop them."""
        parts = self.staged.setdefault(expert, {})
        if part in parts or expert in self.quantized_experts:
            raise ValueError(f"expert {expert} {part} given twice")
        parts[part] = tensor.to(device=self.device, dtype=self.dtype, copy=True)
        if len(parts) < 3:
            return
        del self.staged[expert]
        w13 = torch.cat([parts.pop("w1"), parts.pop("w3")])[None]
        one = quantize_experts(w13, parts.pop("w2")[None], interleaved=False)
        if self.quantized is None:
            self.quantized = {name: t.new_empty((self.num_experts, *t.shape[1:])) for name, t in one.items()}
        for name, t in one.items():
            self.quantized[name][expert] = t[0]
        self.quantized_experts.add(expert)

    def process_weights_after_loading(self) -> None:
        """MXFP4 experts, online: the experts quantized as they arrived, stored (`store_experts`) in the layout the
        device reads; the parameters without storage are dropped. RuntimeError naming the experts not all in. An MXFP4
        checkpoint's experts: stored the same way (-0 codes as +0; ValueError naming an E8M0 0xFF scale)."""
        if hasattr(self, "expert_layout"):
            return
        if self.checkpoint == "mxfp4":
            scales = [getattr(self, name).data for name in self.scale_params]
            for name, s in zip(self.scale_params, scales, strict=True):
                check_e8m0_scales(name, s)
            codes = (positive_zeros(self.w13.data), positive_zeros(self.w2.data))
            for name in ("w13", "w2", *self.scale_params):
                delattr(self, name)
            quantized = dict(zip(("w13_codes", "w2_codes", "w13_scales", "w2_scales"), (*codes, *scales), strict=True))
            store_experts(self, quantized, self.dtype)
            return
        if not self.online_mxfp4:
            return
        if len(self.quantized_experts) < self.num_experts:
            missing = sorted(set(range(self.num_experts)) - self.quantized_experts)
            raise RuntimeError(f"process_weights_after_loading: experts {missing[:8]} not (all) loaded")
        quantized, self.quantized = self.quantized, None
        del self.w13, self.w2
        store_experts(self, quantized, self.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = softmax_topk(F.linear(x, self.gate.weight), self.top_k, renormalize=self.renormalize)
        if self.mxfp4:
            return run_experts(x, weights, ids, *stored_experts(self))
        if self.checkpoint == "fp8_block":
            w13_scales, w2_scales = (getattr(self, name) for name in self.scale_params)
            return run_block_fp8_experts(x, weights, ids, self.w13, w13_scales, self.w2, w2_scales)
        return run_experts(x, weights, ids, self.w13, self.w2)


def check_mxfp4_inter(inter: int) -> None:
    """An MXFP4 checkpoint's experts: the intermediate size is w2's K, in whole 32-wide blocks (online MXFP4 pads it;
    a checkpoint's codes are taken as they are)."""
    if inter % MX_BLOCK_SIZE:
        raise ValueError(
            f"quantization: mxfp4 checkpoint experts need the intermediate size a multiple of {MX_BLOCK_SIZE}, "
            f"got {inter}"
        )


def check_fp8_block_sizes(hidden: int, inter: int) -> None:
    """Block-FP8 experts: H and I are the two GEMMs' K, in whole 128-wide blocks, and w13's up rows start on a
    tile (I fills whole tiles)."""
    if hidden % FP8_BLOCK or inter % FP8_BLOCK:
        raise ValueError(
            f"quantization: block-FP8 experts need hidden_size and the experts' intermediate size multiples of "
            f"{FP8_BLOCK}, got {hidden} and {inter}"
        )


def run_block_fp8_experts(x, topk_weights, topk_ids, w13, w13_scales, w2, w2_scales) -> torch.Tensor:
    """Block-FP8 experts (E4M3 codes and their tile scales) on x [T, H]: `kernels.block_fp8_moe` on CUDA in
    bf16/fp16, `reference.moe.quantized.block_fp8_moe_mirror` elsewhere (the same arithmetic class: activations
    quantized per token and 128-wide group, fp32 block sums, one rounding)."""
    args = (x, w13, w13_scales, w2, w2_scales, topk_weights, topk_ids, "silu")
    if x.is_cuda and x.dtype in (torch.bfloat16, torch.float16):
        from kernels.block_fp8_moe import launch as block_fp8_moe

        return block_fp8_moe(*args)
    return block_fp8_moe_mirror(*args)


def check_mxfp4_hidden(hidden: int) -> None:
    """MXFP4 experts quantize along the hidden size (w13's K) in blocks of 32, which it must fill."""
    if hidden % MX_BLOCK_SIZE:
        raise ValueError(f"quantization: mxfp4 experts need hidden_size a multiple of {MX_BLOCK_SIZE}, got {hidden}")


def pad_gate_up(t: torch.Tensor, pad: int, interleaved: bool) -> torch.Tensor:
    """t [E, 2I, ...] (w13 or its bias) -> [E, 2(I + pad), ...]: `pad` zero gate channels and as many zero up
    channels, each where its layout keeps it: after the I gate rows and after the I up rows (interleaved=False),
    or as `pad` more (gate, up) row pairs at the end (interleaved=True, gpt-oss: gate row 2c, up row 2c + 1)."""
    e, rest = t.shape[0], t.shape[2:]
    inter = t.shape[1] // 2
    split = (e, inter, 2, *rest) if interleaved else (e, 2, inter, *rest)
    dim = 1 if interleaved else 2
    v = t.reshape(split)
    zeros = v.new_zeros(*split[:dim], pad, *split[dim + 1 :])
    return torch.cat([v, zeros], dim=dim).reshape(e, 2 * (inter + pad), *rest)


def quantize_experts(
    w13: torch.Tensor, w2: torch.Tensor, interleaved: bool, w13_bias: torch.Tensor | None = None
) -> dict[str, torch.Tensor]:
    """Online MXFP4 experts: w13 [E, 2I, H] / w2 [E, H, I] with I padded by zeros to a multiple of 32 (gate and
    up channels alike, `pad_gate_up`; w2's columns: a zero gate and up give h = 0 under either activation, which
    a zero w2 column ignores), quantized per expert by the dense layers' `runner.model.quant.mxfp4.quantize_weight`,
    in the layout the kernel reads as it is (that of the reference: codes [E, N, K / 2], scales [E, N, K / 32]).
    Returns {w13_codes, w13_scales, w2_codes, w2_scales}, and w13_bias [E, 2I] padded alike when given (a padded
    channel's gate and up stay 0, so its h does)."""
    pad = -w2.shape[2] % MX_BLOCK_SIZE
    out = {} if w13_bias is None else {"w13_bias": pad_gate_up(w13_bias, pad, interleaved)}
    for name, w in (("w13", pad_gate_up(w13, pad, interleaved)), ("w2", F.pad(w2, (0, pad)))):
        parts = [quantize_weight(e.contiguous()) for e in w]
        out[f"{name}_codes"] = torch.stack([c for c, _ in parts])
        out[f"{name}_scales"] = torch.stack([s for _, s in parts])
    return out


def store_experts(module: nn.Module, quantized: dict[str, torch.Tensor], dtype: torch.dtype) -> None:
    """`quantize_experts`' codes and scales as buffers of `module` in the layout its device reads for activations of
    `dtype` (module doc): w13_words, w13_pairs, w2_words, w2_pairs (fragment, `prepare_experts`) or w13_codes,
    w13_scales, w2_codes, w2_scales; `expert_layout` names it."""
    codes = quantized["w13_codes"]
    hidden, inter = codes.shape[2] * 2, quantized["w2_codes"].shape[2] * 2
    module.expert_layout = "interchange"
    if kernels_run_on(codes.device, dtype):
        from kernels import mxfp4_fragment_layout as fragment
        from kernels._packed_ptx import packed_ptx

        if packed_ptx(codes.device) and hidden % fragment.STEP_K == 0 and inter % fragment.STEP_K == 0:
            module.expert_layout = "fragment"
    for name in ("w13", "w2"):
        c, s = quantized[f"{name}_codes"], quantized[f"{name}_scales"]
        if module.expert_layout == "fragment":
            tensors = dict(zip(("words", "pairs"), prepare_experts(c, s), strict=True))
        else:
            tensors = {"codes": c, "scales": s}
        for kind, t in tensors.items():
            module.register_buffer(f"{name}_{kind}", t)


def prepare_experts(codes: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`kernels.mxfp4_fragment_layout.prepare` of a stack of experts' codes [E, N, K / 2] and scales, an expert at a
    time into the stacked words and pairs it would return: the temporaries are one expert's, not the stack's."""
    from kernels import mxfp4_fragment_layout as fragment

    e, n, half = codes.shape
    lead = (e, n // fragment.ROWS, 2 * half // fragment.STEP_K)
    words = codes.new_empty((*lead, fragment.LANES, 4), dtype=torch.int32)
    pairs = codes.new_empty((*lead, 8, 2), dtype=torch.int32)
    for i in range(e):
        words[i], pairs[i] = fragment.prepare(codes[i], scales[i])
    return words, pairs


def stored_experts(module: nn.Module) -> tuple[torch.Tensor, ...]:
    """(w13, w2, w13_scales, w2_scales) of `store_experts`' buffers, as `run_experts` takes them (the fragment
    layout's words and scale pairs in those places)."""
    if module.expert_layout == "fragment":
        return module.w13_words, module.w2_words, module.w13_pairs, module.w2_pairs
    return module.w13_codes, module.w2_codes, module.w13_scales, module.w2_scales


def run_experts(
    x, topk_weights, topk_ids, w13, w2, w13_scales=None, w2_scales=None, activation="silu", w13_bias=None,
    w2_bias=None,
) -> torch.Tensor:  # fmt: skip
    """The experts of a routed MoE layer on x [T, H], dispatched as the runner runs them: MXFP4 in the fragment
    layout (int32 words and scale pairs, `store_experts`) as `kernels.mxfp4_moe_fragment`; MXFP4 codes (scales
    given) as `kernels.mxfp4_moe` on CUDA in bf16, `reference.moe.quantized.mxfp4_moe_mirror` elsewhere;
    unquantized as `kernels.fused_moe` on CUDA in bf16/fp16, `reference.moe.experts.fused_moe_mirror` elsewhere."""
    if w13.dtype == torch.int32:
        from kernels.mxfp4_moe_fragment import launch as mxfp4_moe_fragment

        return mxfp4_moe_fragment(
            x, w13, w13_scales, w2, w2_scales, topk_weights, topk_ids, activation, w13_bias, w2_bias
        )  # fmt: skip
    if w13_scales is not None:
        args = (x, w13, w13_scales, w2, w2_scales, topk_weights, topk_ids, activation, w13_bias, w2_bias)
        if x.is_cuda and x.dtype == torch.bfloat16:
            from kernels.mxfp4_moe import launch as mxfp4_moe

            return mxfp4_moe(*args)
        return mxfp4_moe_mirror(*args)
    args = (x, w13, w2, topk_weights, topk_ids, activation, w13_bias, w2_bias)
    if x.is_cuda and x.dtype in (torch.bfloat16, torch.float16):
        from kernels.fused_moe import launch as fused_moe

        return fused_moe(*args)
    return moe_reference.fused_moe_mirror(*args)
