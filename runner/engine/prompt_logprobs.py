"""Prompt logprobs: the logprob of every prompt token after the first given the tokens before it, its rank
and the top-k alternatives (runner.engine.logprobs), for the requests that ask (`prompt_logprobs`).

Prompt token p + 1 is scored by the logits at position p, so a step's row that brings prompt positions
[start, start + n) scores targets start + 1 ... min(start + n, P - 1) (P prompt tokens; position P - 1's
logits give the first sampled token, which is a sample logprob, not a prompt one). Under chunked prefill
each chunk scores its own positions; the engine core gathers them in the request's buffer
(`Sequence.prompt_logprobs`) and delivers the whole list once, with the request's first sampled token.
A position served by the prefix cache has no logits: a request that still needs prompt logprobs takes no
cache hits (runner.engine.kv_cache_manager, as vLLM does).

Logits of all the prompt positions of a step are computed `max_rows` rows at a time: the KV sizing's
warm-up measured the logits of max_num_seqs rows (runner.engine.core_build.warm_up), so slices of that
many stay inside the memory it left free.
"""

from __future__ import annotations

import dataclasses

import torch

from runner.engine.logprobs import LogprobTensors, concat, token_logprobs
from runner.engine.scheduler import ScheduledSequence


@dataclasses.dataclass(frozen=True)
class PromptSpan:
    """Row `row` of the step scores prompt targets [first, first + count) from its hidden rows
    [offset, offset + count) (the positions before them)."""

    row: int
    offset: int  # flat index of the row's first new token among the step's tokens
    first: int  # position of the first target token
    count: int
    k: int


def spans(rows: list[ScheduledSequence]) -> list[PromptSpan]:
    """The prompt positions this step scores, per row that needs them (none for most steps: one pass over the
    rows' params)."""
    out, offset = [], 0
    for i, entry in enumerate(rows):
        seq = entry.seq
        if seq.prompt_logprobs is not None:
            count = min(entry.start + entry.num_new_tokens, seq.num_prompt_tokens - 1) - entry.start
            if count > 0:
                out.append(PromptSpan(i, offset, entry.start + 1, count, seq.params.prompt_logprobs))
        offset += entry.num_new_tokens
    return out


def targets(rows: list[ScheduledSequence], todo: list[PromptSpan]) -> list[int]:
    """The scored tokens, span after span (prompt tokens: always known, even while a sample is in flight)."""
    return [t for s in todo for t in rows[s.row].seq.token_ids[s.first : s.first + s.count]]


def hidden_rows(todo: list[PromptSpan]) -> list[int]:
    """The step's token rows whose logits score the targets, span after span."""
    return [r for s in todo for r in range(s.offset, s.offset + s.count)]


def compute(
    compute_logits, hidden: torch.Tensor, index: torch.Tensor, target_ids: torch.Tensor, k: int, max_rows: int
) -> LogprobTensors:
    """Logprobs of the targets: `hidden` [T, H] holds every new token of the step, `index` (`hidden_rows`) and
    `target_ids` (`targets`) are int64 on its device, `k` the most alternatives a span asks for."""
    parts = []
    for lo in range(0, index.shape[0], max_rows):
        logits = compute_logits(hidden[index[lo : lo + max_rows]])
        parts.append(token_logprobs(logits, target_ids[lo : lo + max_rows], k))
    return concat(parts)
