"""The MoE MLP of a gpt-oss decoder layer (HF `mlp`, transformers' `GptOssMLP` in modeling_gpt_oss.py).

Conventions, each as transformers' modeling_gpt_oss.py defines it (the oracle: suites/runner/test_model_gpt_oss_mlp.py):
- router (`GptOssTopKRouter`): a linear layer *with* a bias, logits = x @ router.weight^T + router.bias [T, E];
  the top-k of the logits, then a softmax over those k only, so the k weights always sum to 1
  (`reference.moe.routing.topk_softmax`; not Mixtral's softmax over all E, then the top-k).
- experts (`GptOssExperts`): gate_up = x @ gate_up_proj[e] + gate_up_proj_bias[e] [.., 2I] with gate and up
  *interleaved*: gate channel c is column 2c, up channel c column 2c + 1 (not the [gate | up] halves of Mixtral
  and Qwen3-MoE); the clamped SwiGLU h = (clamp(up, -7, 7) + 1) * g * sigmoid(1.702 g), g = min(gate, 7)
  (alpha 1.702 and limit 7 are constants of `GptOssExperts`, `reference.moe.experts.swiglu_oai`);
  out_e = h @ down_proj[e] + down_proj_bias[e]; out[t] = sum_j w[t, j] * out_{ids[t, j]}[t] (each expert's
  down bias is weighted by its routing weight along with the rest of its output).

Weights: the parameter names are GptOssMLP's state_dict names (`router.weight` [E, H], `router.bias` [E],
`experts.gate_up_proj`, `.gate_up_proj_bias` [E, 2I], `.down_proj`, `.down_proj_bias` [E, H]), so a checkpoint
loads by name (`load_weights`, or each parameter's `weight_loader`). transformers stores the expert matrices
as x @ W, gate_up_proj [E, H, 2I] and down_proj [E, I, H]; here they are held transposed, "NT" like F.linear,
in the layout of `reference.moe.experts` and `kernels.fused_moe` for activation "swiglu_oai": gate_up_proj
[E, 2I, H] (rows interleaved as the columns were) and down_proj [E, H, I]. The weight_loader transposes.
On CUDA in bf16/fp16 the experts run as `kernels.fused_moe`, elsewhere as `reference.moe.experts.fused_moe_mirror`
(`runner.model.moe.run_experts`, the dispatch SparseMoE uses). With `mxfp4=True` the experts are quantized
after loading (`process_weights_after_loading`, `runner.model.moe.quantize_experts`: I zero-padded to the
MX block in (gate, up) pairs, the gate/up bias padded alike), stored in the layout the device reads
(`runner.model.moe.store_experts`) and run as `kernels.mxfp4_moe_fragment` (NVIDIA sm_90+) or `kernels.mxfp4_moe`
on CUDA in bf16, `reference.moe.quantized.mxfp4_moe_mirror` elsewhere; the router and the biases stay unquantized.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from reference.moe.routing import topk_softmax
from runner.model.moe import check_mxfp4_hidden, quantize_experts, run_experts, store_experts, stored_experts


class GptOssMoE(nn.Module):
    def __init__(
        self, hidden: int, inter: int, experts: int, top_k: int, dtype: torch.dtype, device, mxfp4: bool = False
    ) -> None:
        """mxfp4: quantize the experts to MXFP4 once they are loaded (`process_weights_after_loading`)."""
        super().__init__()
        if not 1 <= top_k <= experts:
            raise ValueError(f"top_k: must be in [1, {experts}] (the expert count), got {top_k}")
        if mxfp4:
            check_mxfp4_hidden(hidden)
        self.hidden, self.inter, self.num_experts, self.top_k, self.mxfp4 = hidden, inter, experts, top_k, mxfp4
        self.router = nn.Module()
        self.router.weight = self._param((experts, hidden), dtype, device)
        self.router.bias = self._param((experts,), dtype, device)
        self.experts = nn.Module()
        self.experts.gate_up_proj = self._param((experts, 2 * inter, hidden), dtype, device, transposed=True)
        self.experts.gate_up_proj_bias = self._param((experts, 2 * inter), dtype, device)
        self.experts.down_proj = self._param((experts, hidden, inter), dtype, device, transposed=True)
        self.experts.down_proj_bias = self._param((experts, hidden), dtype, device)

    def _param(self, shape, dtype, device, transposed: bool = False) -> nn.Parameter:
        p = nn.Parameter(torch.empty(shape, dtype=dtype, device=device), requires_grad=False)
        p.weight_loader = self.weight_loader
        p.transposed = transposed  # stored [E, N, K]; the checkpoint has [E, K, N]
        return p

    def weight_loader(self, param: nn.Parameter, tensor: torch.Tensor) -> None:
        """Copy a GptOssMLP tensor into `param`, transposing the two expert matrices to the NT layout."""
        want = (*param.shape[:-2], param.shape[-1], param.shape[-2]) if param.transposed else tuple(param.shape)
        if tuple(tensor.shape) != want:
            name = next((n for n, p in self.named_parameters() if p is param), "parameter")
            layout = " (transformers' x @ W layout)" if param.transposed else ""
            raise ValueError(f"{name}: checkpoint tensor must be {list(want)}{layout}, got {list(tensor.shape)}")
        param.data.copy_(tensor.transpose(-1, -2) if param.transposed else tensor)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Fill every parameter from GptOssMLP-named tensors (a state_dict's items), then
        `process_weights_after_loading`; ValueError naming an unknown, duplicate or missing tensor."""
        params = dict(self.named_parameters())
        pending = set(params)
        for name, tensor in weights:
            if name not in params:
                raise ValueError(f"weights: checkpoint tensor {name!r} has no parameter in this layer")
            if name not in pending:
                raise ValueError(f"weights: checkpoint tensor {name!r} given twice")
            params[name].weight_loader(params[name], tensor)
            pending.discard(name)
        if pending:
            raise ValueError(f"weights: {len(pending)} parameters not in the checkpoint: {sorted(pending)}")
        self.process_weights_after_loading()

    def process_weights_after_loading(self) -> None:
        """MXFP4 experts, online: `quantize_experts` of the loaded matrices (interleaved gate/up rows); the
        gate/up bias gets the same zero (gate, up) pairs, so a padded channel's gate is 0 and its h is 0. The
        unquantized matrices are dropped; the biases stay parameters."""
        if not self.mxfp4 or hasattr(self, "expert_layout"):
            return
        experts = self.experts
        quantized = quantize_experts(
            experts.gate_up_proj.data, experts.down_proj.data, True, experts.gate_up_proj_bias.data
        )
        experts.gate_up_proj_bias.data = quantized.pop("w13_bias")
        dtype = experts.gate_up_proj.dtype
        del experts.gate_up_proj, experts.down_proj
        store_experts(self, quantized, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, H] -> [T, H]."""
        weights, ids = topk_softmax(F.linear(x, self.router.weight, self.router.bias), self.top_k)
        e = self.experts
        if self.mxfp4:
            w13, w2, *scales = stored_experts(self)
        else:
            w13, w2, scales = e.gate_up_proj, e.down_proj, (None, None)
        return run_experts(
            x, weights, ids, w13, w2, *scales, activation="swiglu_oai", w13_bias=e.gate_up_proj_bias,
            w2_bias=e.down_proj_bias,
        )  # fmt: skip
