"""Request state: one `Sequence` per prompt, from WAITING through RUNNING to FINISHED.

A sequence is its token ids (prompt then generated), `num_computed_tokens` (how many of them have K/V in
the cache) and its block table. There is no separate prefill/decode phase: each step the scheduler gives a
sequence up to `num_tokens - num_computed_tokens` new tokens (a whole prompt, a prompt chunk, or the one
token sampled last step), as in vLLM v1.

Under asynchronous scheduling a sequence may also have tokens in flight: scheduled in launched steps whose
outputs are not known yet (`num_inflight_tokens`; `num_scheduled_tokens` = computed + in flight is where its
next step starts) and samples of such steps (`num_pending_samples`: tokens not in token_ids yet, so never
hashed). See runner.engine.scheduler.

Preemption by recompute (`reset_for_recompute`) frees the blocks and sets num_computed_tokens to 0 but keeps
every generated token: the whole token list is the "prompt" of the recompute, and its full blocks may hit
the prefix cache again. A seeded request owns a `torch.Generator`, created on the sampler's device on first
use and advanced only by its own samples, so its tokens do not depend on the batch it shares (and a
recompute re-samples nothing: the generated tokens are kept).
"""

from __future__ import annotations

import enum
import itertools
from typing import TYPE_CHECKING

import torch

from runner.engine.hashing import BlockHash, extend_block_hashes
from runner.engine.sampling_params import SamplingParams, is_greedy

if TYPE_CHECKING:
    from runner.engine.block_pool import KVCacheBlock
    from runner.engine.messages import TokenLogprobs


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class FinishReason(enum.StrEnum):
    LENGTH = "length"  # max_tokens or max_model_len reached
    STOP = "stop"  # EOS, a stop token id or a stop string
    ABORT = "abort"


_arrivals = itertools.count()


class Sequence:
    def __init__(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams | None = None,
        *,
        request_id: str | int | None = None,
        block_size: int = 16,
    ) -> None:
        if not isinstance(prompt_token_ids, list | tuple) or not prompt_token_ids:
            raise ValueError(f"prompt_token_ids: must be a non-empty list of token ids, got {prompt_token_ids!r}")
        if any(isinstance(t, bool) or not isinstance(t, int) or t < 0 for t in prompt_token_ids):
            raise ValueError("prompt_token_ids: every token id must be an int >= 0")
        params = params if params is not None else SamplingParams()
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params: must be SamplingParams, got {type(params).__name__}")
        self.arrival = next(_arrivals)  # FCFS order; also the preemption order (latest arrival goes first)
        self.request_id = self.arrival if request_id is None else request_id
        self.params = params
        self.block_size = block_size
        self.token_ids: list[int] = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.num_computed_tokens = 0
        # Asynchronous scheduling (runner.engine.scheduler): tokens scheduled in launched steps whose outputs
        # are not known yet (their K/V is being written), and their samples (tokens not in token_ids yet).
        self.num_inflight_tokens = 0
        self.num_pending_samples = 0
        self.last_step = -1  # the latest step that scheduled it, and its row there
        self.last_row = -1
        self.block_table: list[KVCacheBlock] = []
        self.block_ids: list[int] = []  # block_table's ids, kept alongside it (the step inputs read these)
        self.num_cached_blocks = 0  # leading blocks of block_table registered in the prefix cache
        self.table_row: int | None = None  # row of the scheduler's persistent block table while running
        self.table_synced = 0  # block ids already written to that row
        self.block_hashes: list[BlockHash] = extend_block_hashes([], self.token_ids, block_size)
        self.status = SequenceStatus.WAITING
        self.finish_reason: FinishReason | None = None
        self.stop_reason: int | str | None = None  # the stop token id or stop string that finished it
        self.num_preemptions = 0
        # Prompt logprobs gathered chunk by chunk (entry p scores prompt token p; entry 0 stays None), until
        # they are delivered with the first sampled token; None when not asked for or once delivered.
        self.prompt_logprobs: list[TokenLogprobs | None] | None = (
            [None] * self.num_prompt_tokens if params.prompt_logprobs is not None else None
        )
        self._generator: torch.Generator | None = None
        # Per-request constants the decode fast path reads instead of the params (runner.engine.decode_schedule,
        # decode_update): set by the scheduler when it accepts the request (Scheduler.add), as they depend on
        # its config. The token ids that finish the request (EOS unless ignore_eos, stop token ids), and the
        # token count at which it ends by length (max_tokens or max_model_len).
        self.finish_ids: frozenset[int] = frozenset()
        self.finish_len = 0
        # Greedy with no logprobs: the model runner needs no sampling tensors and no logprobs for it.
        self.plain_greedy = is_greedy(params) and params.logprobs is None

    # --- sizes --------------------------------------------------------------------------------------------
    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.token_ids[: self.num_prompt_tokens]

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def num_scheduled_tokens(self) -> int:
        """Tokens whose K/V is in the cache or being written by a launched step: where the next step starts."""
        return self.num_computed_tokens + self.num_inflight_tokens

    @property
    def num_unscheduled_tokens(self) -> int:
        """Tokens no step has taken yet, counting the ones launched steps are sampling."""
        return self.num_tokens + self.num_pending_samples - self.num_scheduled_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    # --- transitions ----------------------------------------------------------------------------------------
    def append_token(self, token_id: int) -> None:
        self.token_ids.append(int(token_id))
        extend_block_hashes(self.block_hashes, self.token_ids, self.block_size)

    def reset_for_recompute(self) -> None:
        """After its blocks were freed: everything (generated tokens included) must be computed again."""
        self.num_computed_tokens = 0
        self.num_inflight_tokens = 0  # K/V a launched step still writes is dropped; a token it samples is kept
        self.block_table = []
        self.block_ids = []
        self.num_cached_blocks = 0
        self.status = SequenceStatus.WAITING
        self.num_preemptions += 1

    def finish(self, reason: FinishReason, stop_reason: int | str | None = None) -> None:
        self.status = SequenceStatus.FINISHED
        self.finish_reason = reason
        self.stop_reason = stop_reason

    # --- sampling ------------------------------------------------------------------------------------------
    def generator(self, device: torch.device | str) -> torch.Generator | None:
        """This request's own generator (seeded requests only), created on `device` on first use."""
        if self.params.seed is None:
            return None
        device = torch.device(device)
        if self._generator is None:
            self._generator = torch.Generator(device=device)
            self._generator.manual_seed(self.params.seed)
        elif self._generator.device.type != device.type:  # a new generator would restart the seed's stream
            raise ValueError(f"device: request {self.request_id!r} samples on {self._generator.device}, not {device}")
        return self._generator

    def __repr__(self) -> str:
        return (
            f"Sequence(id={self.request_id!r}, {self.status.value}, tokens={self.num_tokens}, "
            f"prompt={self.num_prompt_tokens}, computed={self.num_computed_tokens}, blocks={self.block_ids})"
        )
