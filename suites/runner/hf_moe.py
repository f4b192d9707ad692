"""Tiny transformers MoE checkpoints for the runner's parity tests: build the HF model from a config with seeded
random weights at unit scale, save it, and read HF's own greedy tokens and first-step logits."""

from __future__ import annotations

import torch

PROMPTS = [[5, 17, 33, 2, 9, 41], [60, 3, 3, 71], [7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19]]
NEW_TOKENS = 8


def save_tiny(model_cls, config, path):
    """(path, the fp32 HF model) with every matrix N(0, 1/fan-in): transformers' init (std 0.02) makes every
    logit ~0, so greedy tokens would hang on ties."""
    torch.manual_seed(0)
    hf = model_cls(config).float().eval()
    with torch.no_grad():
        for p in hf.parameters():
            if p.dim() >= 2:
                p.normal_(0, p.shape[-1] ** -0.5)
    hf.save_pretrained(path)
    return path, hf


def hf_greedy(hf, prompt: list[int]) -> tuple[list[int], torch.Tensor]:
    """HF's greedy continuation of `prompt` (NEW_TOKENS tokens) and its logits for the first new token."""
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, do_sample=False)
        first = hf(torch.tensor([prompt])).logits[0, -1]
    return out[0, len(prompt) :].tolist(), first
