"""Offline throughput workloads: prompts of random token ids, the shape of nano-vllm's bench.py (lengths uniform
in [100, 1024], ignore_eos, output tokens / wall time). W1 fixes the output length at 512
(nano-vllm draws it per request) so both engines produce exactly the same number of tokens."""

from __future__ import annotations

import dataclasses

import torch


@dataclasses.dataclass(frozen=True)
class Workload:
    name: str
    requests: int
    min_input: int
    max_input: int
    output_len: int
    seed: int = 0

    def prompts(self, vocab_size: int) -> list[list[int]]:
        """`requests` prompts, lengths uniform in [min_input, max_input], ids uniform in [0, vocab_size), all
        drawn from one torch.Generator seeded with `seed` (the same prompts on every machine)."""
        gen = torch.Generator().manual_seed(self.seed)
        lengths = torch.randint(self.min_input, self.max_input + 1, (self.requests,), generator=gen).tolist()
        return [torch.randint(0, vocab_size, (n,), generator=gen).tolist() for n in lengths]

    def scaled(self, requests: int | None = None, output_len: int | None = None) -> Workload:
        """A smaller run of the same shape (smoke tests): fewer requests and/or fewer output tokens."""
        return dataclasses.replace(self, requests=requests or self.requests, output_len=output_len or self.output_len)


W1 = Workload("w1", requests=256, min_input=100, max_input=1024, output_len=512)
# CPU: the real model against HF generate, small enough for two cores.
CPU_REAL = Workload("cpu-real", requests=8, min_input=16, max_input=64, output_len=32)
