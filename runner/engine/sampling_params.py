"""Per-request sampling parameters, validated at construction (ValueError/TypeError naming the field).

Defaults follow vLLM's `SamplingParams`: temperature 1, top_p 1, top_k off,
max_tokens 16. `temperature == 0` means greedy (argmax, ties to the lowest token id); top_k 0 or -1 and
top_p 1 mean "off". `stop` strings need detokenized text, so the scheduler only asks a hook the API layer
fills (see runner.engine.scheduler); `stop_token_ids` apply even with `ignore_eos` (which ignores only the
model's EOS ids), as in vLLM. `logprobs` / `prompt_logprobs`: how many top alternatives to return with the
logprob of each generated / prompt token (None: no logprobs).
"""

from __future__ import annotations

import dataclasses
import math

MAX_LOGPROBS = 20  # top alternatives a position may ask for (OpenAI's top_logprobs limit, vLLM's default)
GREEDY_EPS = 1e-5  # temperatures below it sample greedily (runner.engine.sampler says why)


def _check_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: must be an int, got {type(value).__name__} {value!r}")
    return value


def _check_number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name}: must be a number, got {type(value).__name__} {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{name}: must be finite, got {value!r}")
    return float(value)


@dataclasses.dataclass
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None
    max_tokens: int = 16
    stop: list[str] = dataclasses.field(default_factory=list)
    stop_token_ids: list[int] = dataclasses.field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None  # logprobs of each generated token and its top-k alternatives (0: the token's)
    prompt_logprobs: int | None = None  # the same for every prompt token after the first

    def __post_init__(self) -> None:
        self.temperature = _check_number("temperature", self.temperature)
        if self.temperature < 0:
            raise ValueError(f"temperature: must be >= 0 (0 = greedy), got {self.temperature}")
        self.top_p = _check_number("top_p", self.top_p)
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p: must be in (0, 1], got {self.top_p}")
        if _check_int("top_k", self.top_k) < -1:
            raise ValueError(f"top_k: must be >= 1, or 0 / -1 for off, got {self.top_k}")
        if self.seed is not None and not -(2**63) <= _check_int("seed", self.seed) < 2**64:
            raise ValueError(f"seed: must be in [-2**63, 2**64) (a torch.Generator seed), got {self.seed}")
        if _check_int("max_tokens", self.max_tokens) < 1:
            raise ValueError(f"max_tokens: must be >= 1, got {self.max_tokens}")
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if not isinstance(self.stop, list | tuple) or not all(isinstance(s, str) and s for s in self.stop):
            raise ValueError(f"stop: must be a list of non-empty strings, got {self.stop!r}")
        self.stop = list(self.stop)
        if not isinstance(self.stop_token_ids, list | tuple):
            raise TypeError(f"stop_token_ids: must be a list of ints, got {self.stop_token_ids!r}")
        for token in self.stop_token_ids:
            if _check_int("stop_token_ids", token) < 0:
                raise ValueError(f"stop_token_ids: token ids are >= 0, got {token}")
        self.stop_token_ids = list(self.stop_token_ids)
        if not isinstance(self.ignore_eos, bool):
            raise TypeError(f"ignore_eos: must be a bool, got {self.ignore_eos!r}")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and not 0 <= _check_int(name, value) <= MAX_LOGPROBS:
                raise ValueError(f"{name}: must be in [0, {MAX_LOGPROBS}], got {value}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def top_k_enabled(self) -> bool:
        return self.top_k > 0


def is_greedy(params: SamplingParams) -> bool:
    return params.temperature < GREEDY_EPS
