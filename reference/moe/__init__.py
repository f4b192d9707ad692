"""Mixture-of-experts references: routing (`routing`), token -> expert alignment to the grouped GEMM's blocks
(`align`), and the expert MLP with its weighted combine (`experts`).

Conventions, each stated where it is defined and tested in suites/moe:
- Fused gate/up weight `w13` [E, 2I, H]: gate rows first, then up rows (vLLM and transformers 5.x), except
  gpt-oss, whose gate and up columns interleave (gate at even, up at odd positions: `swiglu_oai`).
- Top-k weights are renormalized to sum 1 per token or not, per model (Mixtral yes; Qwen3-MoE by
  norm_topk_prob; DeepSeek-V3 by norm_topk_prob, before the routed scaling factor).
- DeepSeek-V3's correction bias chooses the experts only; their weights are the unbiased sigmoid scores.
- The routed scaling factor multiplies the top-k weights (so every expert's output), not the shared expert's.
"""
