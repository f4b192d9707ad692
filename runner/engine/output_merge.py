"""Consecutive `StepOutputs` of an engine core as one: what a frontend that fell behind the core processes at once.

At 256 streams a frontend spends ~10 us of Python a request and step on the core's outputs (detokenization,
the output processor, the stream queues: cProfile of `touchstone serve` over an engine core without a model,
bench/serve/frontend_ceiling.py), about a decode step's device time on the H200. When several steps' outputs
are already waiting, taking each request's tokens of all of them in one delta does that work once a request
instead of once a step; a frontend that keeps up never merges anything.

Merged, a request's delta carries its tokens (and their logprobs) of every step in order, its prompt logprobs
and cached-token count from the step that first sent them, and its finish from the last step; the load is
the last step's; accepted and rejected requests are those of every step, in order.
"""

from __future__ import annotations

from collections.abc import Sequence

from runner.engine import messages as m


def merge_step_outputs(outputs: Sequence[m.StepOutputs]) -> m.StepOutputs:
    if len(outputs) == 1:
        return outputs[0]
    merged: dict[str, m.RequestDelta] = {}
    for step in outputs:
        for delta in step.deltas:
            seen = merged.get(delta.request_id)
            if seen is None:
                merged[delta.request_id] = m.RequestDelta(
                    delta.request_id,
                    list(delta.new_token_ids),
                    delta.finish_reason,
                    delta.stop_reason,
                    list(delta.new_logprobs) if delta.new_logprobs is not None else None,
                    delta.prompt_logprobs,
                    delta.num_cached_tokens,
                )
                continue
            seen.new_token_ids += delta.new_token_ids
            if delta.new_logprobs is not None:
                seen.new_logprobs = (seen.new_logprobs or []) + list(delta.new_logprobs)
            if seen.prompt_logprobs is None:
                seen.prompt_logprobs = delta.prompt_logprobs
            seen.num_cached_tokens = seen.num_cached_tokens or delta.num_cached_tokens
            seen.finish_reason, seen.stop_reason = delta.finish_reason, delta.stop_reason
    return m.StepOutputs(
        list(merged.values()),
        outputs[-1].load,
        [r for step in outputs for r in step.accepted],
        [r for step in outputs for r in step.rejected],
    )
