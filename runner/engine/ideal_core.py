"""An engine core without a model, for measuring and testing the server's frontend (bench/serve/frontend_ceiling.py,
through runner.engine.core_process's TOUCHSTONE_CORE_FACTORY): it
speaks the engine core's protocol (runner.engine.messages) in a real engine-core process, schedules like the
engine (a token budget a step, chunked prefill, at most max_num_seqs running, first come first served) and
spends on each step the device time the H200 measured for the SmolLM2-135M shape, as a sleep:

    step = DECODE_MS + PREFILL_US_PER_TOKEN * prompt tokens in the step

DECODE_MS 3.0: W1's step profile on the H200 (3.01 ms of device work a step, 256 requests decoding;
reports/cuda-h200/runner_w1.md); PREFILL_US_PER_TOKEN 0.85: ~7 ms of device work for an 8,192-token prefill
step there. TOUCHSTONE_IDEAL_DECODE_MS and TOUCHSTONE_IDEAL_PREFILL_US override them. A request's tokens are
fixed ids (a function of its id and position, in [1000, 21000)), its first sampled in the step that finishes
its prompt, one a step after; it finishes with "length" at max_tokens (stop conditions beyond that are
the frontend's). `offline_rate` runs the same schedule in-process on a workload, without any frontend: the
ceiling a served run is measured against.
"""

from __future__ import annotations

import dataclasses
import os
import time
import zlib

from runner.engine import messages as m
from runner.model.config import registered

DECODE_MS = 3.0
PREFILL_US_PER_TOKEN = 0.85
TOKEN_BASE, TOKEN_SPAN = 1000, 20000


@dataclasses.dataclass
class _Request:
    request_id: str
    prompt_len: int
    max_tokens: int
    salt: int
    prefilled: int = 0
    produced: int = 0


class IdealCore:
    def __init__(self, config, decode_ms: float | None = None, prefill_us: float | None = None) -> None:
        env = os.environ
        if decode_ms is None:
            decode_ms = float(env.get("TOUCHSTONE_IDEAL_DECODE_MS", DECODE_MS))
        if prefill_us is None:
            prefill_us = float(env.get("TOUCHSTONE_IDEAL_PREFILL_US", PREFILL_US_PER_TOKEN))
        self.decode_s, self.prefill_s = decode_ms / 1e3, prefill_us / 1e6
        self.vocab_size = registered(config.model).config.vocab_size
        self.max_model_len, self.block_size = config.max_model_len, config.block_size
        self.max_seqs = config.max_num_seqs
        self.budget = config.max_num_batched_tokens or max(8192, config.max_num_seqs)
        self.waiting: dict[str, _Request] = {}  # in arrival order
        self.running: dict[str, _Request] = {}
        self.steps = self.decode_steps = self.batched_tokens = 0
        self.step_s = 0.0

    def add_request(self, request: m.AddRequest) -> None:
        n, params = len(request.prompt_token_ids), request.params
        if request.request_id in self.running or request.request_id in self.waiting:
            raise ValueError(f"request_id: {request.request_id!r} is already running")
        if n + params.max_tokens > self.max_model_len:
            raise ValueError(f"max_tokens: prompt {n} + max_tokens {params.max_tokens} > {self.max_model_len}")
        salt = zlib.crc32(request.request_id.encode()) % 997
        self.waiting[request.request_id] = _Request(request.request_id, n, params.max_tokens, salt)

    def abort(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            self.running.pop(request_id, None)
            self.waiting.pop(request_id, None)

    @property
    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def live_request_ids(self) -> list[str]:
        return [*self.running, *self.waiting]

    def load(self) -> m.CoreLoad:
        blocks = 1 << 20
        return m.CoreLoad(
            len(self.running), len(self.waiting), blocks, blocks, 0, 0, self.steps, self.decode_steps,
            self.batched_tokens, self.step_s,
        )  # fmt: skip

    def ready(self, device: str) -> m.Ready:
        load = self.load()
        return m.Ready(self.max_model_len, load.blocks_usable, self.block_size, self.vocab_size, "ideal", [], load)

    def _schedule(self) -> tuple[list[_Request], int]:
        """The step's rows: every running request whose prompt is done decodes one token; then prompt chunks, the
        partly prefilled first, then new requests while there is budget and a free seat."""
        decoding = [r for r in self.running.values() if r.prefilled == r.prompt_len]
        budget = self.budget - len(decoding)
        prompt_tokens = 0
        for r in self.running.values():
            if r.prefilled < r.prompt_len and budget > 0:
                chunk = min(r.prompt_len - r.prefilled, budget)
                r.prefilled += chunk
                budget -= chunk
                prompt_tokens += chunk
                if r.prefilled == r.prompt_len:
                    decoding.append(r)
        while self.waiting and budget > 0 and len(self.running) < self.max_seqs:
            r = self.waiting.pop(next(iter(self.waiting)))
            self.running[r.request_id] = r
            chunk = min(r.prompt_len, budget)
            r.prefilled = chunk
            budget -= chunk
            prompt_tokens += chunk
            if r.prefilled == r.prompt_len:
                decoding.append(r)
        return decoding, prompt_tokens

    def step(self) -> m.StepOutputs:
        started = time.perf_counter()
        sampling, prompt_tokens = self._schedule()
        deltas = []
        for r in sampling:
            token = TOKEN_BASE + (r.salt * 31 + r.produced * 7) % TOKEN_SPAN
            r.produced += 1
            finish = "length" if r.produced >= r.max_tokens else None
            if finish is not None:
                del self.running[r.request_id]
            deltas.append(m.RequestDelta(r.request_id, [token], finish))
        spend = self.decode_s + self.prefill_s * prompt_tokens - (time.perf_counter() - started)
        if spend > 0:
            time.sleep(spend)
        self.steps += 1
        self.decode_steps += prompt_tokens == 0
        self.batched_tokens += prompt_tokens + len(sampling)
        self.step_s += time.perf_counter() - started
        return m.StepOutputs(deltas, self.load())


def build(config) -> IdealCore:
    """TOUCHSTONE_CORE_FACTORY="runner.engine.ideal_core:build"."""
    return IdealCore(config)


def offline_rate(config, prompt_len: int, output_len: int, requests: int) -> float:
    """Output tokens per second of the ideal core alone on `requests` requests, all queued at once."""
    from runner.engine.sampling_params import SamplingParams

    core = IdealCore(config)
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    for i in range(requests):
        core.add_request(m.AddRequest(f"offline-{i}", [TOKEN_BASE] * prompt_len, params))
    started, tokens = time.perf_counter(), 0
    while core.has_unfinished:
        tokens += sum(len(d.new_token_ids) for d in core.step().deltas)
    return tokens / (time.perf_counter() - started)
