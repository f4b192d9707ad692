"""Batched token sampling on fp32 logits [B, vocab]: greedy, temperature, top-k, top-p, per-request seeds.

Per row (request), in this order:
- greedy when temperature < 1e-5 (0 by the API; smaller positive values would overflow logits / t, the same
  epsilon as vLLM): argmax of the raw logits, ties to the LOWEST token id (torch.argmax returns the first).
- else logits / temperature; top-k keeps the k largest (ties at the k-th value: the lowest ids, by a stable
  descending sort); top-p (nucleus) keeps, in descending order, every token whose EXCLUSIVE cumulative
  probability (of the top-k-renormalised distribution) is below p: the token that crosses p is kept and
  so is the first token always (the boundary bug of nano-vllm PR #196/#260 drops it). top_p = 1 masks
  nothing (cumulative rounding must not cut the tail).
- a sample by the exponential race: argmax_i p_i / E_i with E_i ~ Exp(1) i.i.d. picks i with probability
  p_i (min_i E_i / p_i is Exp(sum p) and token i wins it with odds p_i / sum p, so p need not be
  normalised: w_i = exp(l_i - max l) is used); masked tokens have w_i = 0 and are never picked. A seeded
  request draws its E from its own generator (Sequence.generator), vocab-many per sampled token, so its
  tokens do not depend on the batch it is in or on other requests; unseeded rows draw from torch's default
  generator in one batched call. Call it only for rows that sample (SchedulerOutput: `samples`): a prompt
  chunk must not advance a seeded generator.
Policy: each row needs at least one finite logit (a row of all -inf has no distribution; NaN logits are the
model's bug and are not screened: argmax would pick them).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence as Seq

import torch

from runner.engine.host_copy import to_device
from runner.engine.sampling_params import GREEDY_EPS, SamplingParams, is_greedy
from runner.engine.sequence import Sequence

__all__ = ["GREEDY_EPS", "SamplingBatch", "apply_top_k_top_p", "is_greedy", "sample"]


@dataclasses.dataclass(frozen=True)
class SamplingBatch:
    temperature: torch.Tensor  # fp32 [B]; < GREEDY_EPS = greedy
    top_k: torch.Tensor  # int64 [B]; vocab size = off
    top_p: torch.Tensor  # fp32 [B]; 1 = off
    generators: tuple[torch.Generator | None, ...]  # per row: its own generator, or None for the default
    all_greedy: bool
    any_top_k: bool
    any_top_p: bool

    @classmethod
    def build(
        cls,
        params: Seq[SamplingParams],
        vocab_size: int,
        device: torch.device | str = "cpu",
        generators: Seq[torch.Generator | None] | None = None,
    ) -> SamplingBatch:
        generators = tuple(generators) if generators is not None else (None,) * len(params)
        if len(generators) != len(params):
            raise ValueError(f"generators: {len(generators)} for {len(params)} rows")
        top_k = [p.top_k if 0 < p.top_k < vocab_size else vocab_size for p in params]
        return cls(
            temperature=to_device([p.temperature for p in params], torch.float32, device),
            top_k=to_device(top_k, torch.int64, device),
            top_p=to_device([p.top_p for p in params], torch.float32, device),
            generators=generators,
            all_greedy=all(map(is_greedy, params)),
            any_top_k=any(k < vocab_size for k in top_k),
            any_top_p=any(p.top_p < 1 for p in params),
        )

    @classmethod
    def from_sequences(cls, seqs: Seq[Sequence], vocab_size: int, device: torch.device | str) -> SamplingBatch:
        return cls.build([s.params for s in seqs], vocab_size, device, [s.generator(device) for s in seqs])


def apply_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None) -> torch.Tensor:
    """`logits` [B, V] with every token outside row b's top-k / nucleus set to -inf (a new tensor)."""
    values, order = logits.sort(dim=-1, descending=True, stable=True)
    if top_k is not None:
        ranks = torch.arange(logits.shape[-1], device=logits.device)
        values = values.masked_fill(ranks[None, :] >= top_k[:, None], float("-inf"))
    if top_p is not None:
        weights = (values - values[:, :1]).exp()  # sorted descending: column 0 holds the row max
        probs = weights / weights.sum(dim=-1, keepdim=True)
        before = probs.cumsum(dim=-1) - probs  # probability mass strictly ahead of each token
        drop = (before >= top_p[:, None]) & (top_p < 1)[:, None]
        drop[:, 0] = False
        values = values.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, values)


def sample(logits: torch.Tensor, batch: SamplingBatch | None) -> torch.Tensor:
    """One token id per row (int64 [B]). `batch` None: every row is greedy (the caller saw it from the params
    and built no per-row tensors: the common decode batch costs no host-to-device copies)."""
    if not isinstance(logits, torch.Tensor) or logits.dtype != torch.float32 or logits.dim() != 2:
        raise TypeError(
            f"logits: must be a 2-D float32 tensor, got {getattr(logits, 'dtype', type(logits))} "
            f"of shape {tuple(getattr(logits, 'shape', ()))}"
        )
    if batch is not None and logits.shape[0] != batch.temperature.shape[0]:
        raise ValueError(f"logits: {logits.shape[0]} rows for a batch of {batch.temperature.shape[0]}")
    greedy_tokens = logits.argmax(dim=-1)
    if batch is None or batch.all_greedy:
        return greedy_tokens
    greedy = batch.temperature < GREEDY_EPS
    scaled = logits / torch.where(greedy, 1.0, batch.temperature)[:, None]
    if batch.any_top_k or batch.any_top_p:
        scaled = apply_top_k_top_p(
            scaled, batch.top_k if batch.any_top_k else None, batch.top_p if batch.any_top_p else None
        )
    # Unnormalised probabilities: the race's argmax does not depend on the row's normaliser.
    weights = (scaled - scaled.amax(dim=-1, keepdim=True)).exp_()
    race = torch.empty_like(weights).exponential_()
    for row, generator in enumerate(batch.generators):
        if generator is not None:
            race[row].exponential_(generator=generator)
    # E = 0 has probability ~0 but would divide to inf (or NaN on a masked token): keep it positive.
    sampled = (weights / race.clamp_min_(torch.finfo(torch.float32).tiny)).argmax(dim=-1)
    return torch.where(greedy, greedy_tokens, sampled)
