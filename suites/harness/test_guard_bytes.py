"""`suites.guard_bytes.poisoned_allocations` on the CPU: every allocating op's result starts poisoned while the
context is open (the MoE suites rely on it to see a row no kernel wrote), each dtype with its own poison."""

from __future__ import annotations

import torch

from suites.guard_bytes import POISON, poison_value, poisoned_allocations


def _bytes(t: torch.Tensor) -> set[int]:
    return set(torch.empty(0, dtype=torch.uint8).set_(t.untyped_storage()).tolist())


def test_every_allocating_op_is_poisoned_by_dtype():
    base = torch.ones(3, 4)
    with poisoned_allocations("cpu"):
        made = {
            "empty": torch.empty(3, 4),
            "new_empty": base.new_empty(5),
            "empty_strided": torch.empty_strided((2, 3), (1, 2)),
            "empty_like of a transpose": torch.empty_like(base.t()),
            "int32": torch.empty(3, dtype=torch.int32),
            "bool": torch.empty(2, dtype=torch.bool),
        }
        zeros = torch.zeros(3)
    for name, t in made.items():
        assert _bytes(t) == {poison_value(t.dtype)}, name
    assert poison_value(torch.bfloat16) == POISON and poison_value(torch.int64) == 0x7F
    assert bool(made["bool"].all()) and int(made["int32"][0]) > 2**30  # a valid bool; no index, and not -1
    assert torch.equal(zeros, torch.zeros(3))  # an op that writes its result keeps its values
