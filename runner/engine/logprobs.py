"""Logprobs of chosen tokens: each token's log-probability under the model's distribution, its rank and the
top-k alternatives of its position.

The distribution is log_softmax of the raw fp32 logits, before temperature, top-k and top-p: vLLM's default
("raw logprobs"), what OpenAI's `logprobs` and lm-evaluation-harness's log-likelihood read. A sampled
token's logprob is thus the model's, not the sampler's (a token that top-k made certain still has its own).

Rank: 1 + the number of tokens strictly more likely, so the argmax (greedy) token has rank 1 even on a tie
(vLLM counts ties against the token: its rank can exceed 1 there). Top-k: torch.topk, most likely first.

Everything is computed on the logits' device for the rows that asked (one batched call per step), and read
back as a whole (`LogprobTensors.to_host`, then `entries`).
"""

from __future__ import annotations

import dataclasses

import torch

from runner.engine.messages import TokenLogprobs


@dataclasses.dataclass(frozen=True)
class LogprobTensors:
    """R positions: the chosen token of each, its logprob and rank, and the top `k` of its position."""

    token_ids: torch.Tensor  # int64 [R]
    logprobs: torch.Tensor  # fp32 [R]
    ranks: torch.Tensor  # int64 [R]
    top_ids: torch.Tensor  # int64 [R, k]
    top_logprobs: torch.Tensor  # fp32 [R, k]

    def to_host(self, non_blocking: bool = False) -> LogprobTensors:
        """On the CPU. non_blocking from CUDA: pinned copies that are valid once the stream got past them
        (the caller waits on an event recorded after this call)."""
        return LogprobTensors(
            *(getattr(self, f.name).to("cpu", non_blocking=non_blocking) for f in dataclasses.fields(self))
        )

    def entries(self, ks: list[int]) -> list[TokenLogprobs]:
        """One TokenLogprobs per position, position r keeping its first ks[r] alternatives (host tensors)."""
        ids, lps, ranks = self.token_ids.tolist(), self.logprobs.tolist(), self.ranks.tolist()
        top_ids, top_lps = self.top_ids.tolist(), self.top_logprobs.tolist()
        return [TokenLogprobs(ids[r], lps[r], ranks[r], top_ids[r][:k], top_lps[r][:k]) for r, k in enumerate(ks)]


def token_logprobs(logits: torch.Tensor, token_ids: torch.Tensor, k: int) -> LogprobTensors:
    """`logits` fp32 [R, V], `token_ids` int64 [R] (the chosen token of each row), `k` alternatives a row."""
    lp = torch.log_softmax(logits, dim=-1)
    chosen = lp.gather(1, token_ids[:, None])
    ranks = (lp > chosen).sum(dim=-1) + 1
    top_lp, top_ids = lp.topk(k, dim=-1) if k else (lp[:, :0], token_ids[:, None][:, :0])
    return LogprobTensors(token_ids, chosen[:, 0], ranks, top_ids, top_lp)


def concat(parts: list[LogprobTensors]) -> LogprobTensors:
    """The positions of several calls with the same k, in order."""
    if len(parts) == 1:
        return parts[0]
    return LogprobTensors(*(torch.cat([getattr(p, f.name) for p in parts]) for f in dataclasses.fields(LogprobTensors)))
