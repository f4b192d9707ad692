"""The model runner's step packing (runner.engine.step_tensors) equals the scheduler's documented
`SchedulerOutput.step_inputs`, field by field, over random workloads with chunked prefill, prefix hits,
decodes and preemption (fake tokens, no model)."""

from __future__ import annotations

import dataclasses

import torch
from hypothesis import given
from hypothesis import strategies as st

from runner.engine.sampling_params import SamplingParams
from runner.engine.scheduler import Scheduler, SchedulerConfig
from runner.engine.sequence import Sequence
from runner.engine.step_tensors import StepPacker


def _assert_same(got, want) -> None:
    for field in dataclasses.fields(want):
        a, b = getattr(got, field.name), getattr(want, field.name)
        if isinstance(b, torch.Tensor):
            assert a.dtype == b.dtype and a.tolist() == b.tolist(), field.name
        else:
            assert a == b, field.name


@given(
    lengths=st.lists(st.integers(1, 40), min_size=1, max_size=6),
    budget=st.integers(8, 48),
    num_blocks=st.integers(12, 40),
    shared=st.integers(0, 12),
    seed=st.integers(0, 2**16),
    max_tokens=st.integers(1, 24),
)
def test_pack_equals_step_inputs(lengths, budget, num_blocks, shared, seed, max_tokens):
    """Long decodes too: the decode fast path's columns (runner.engine.decode_schedule) packed directly."""
    gen = torch.Generator().manual_seed(seed)
    scheduler = Scheduler(
        SchedulerConfig(
            num_blocks=num_blocks,
            block_size=4,
            max_num_batched_tokens=budget,
            max_num_seqs=min(4, budget),
            max_model_len=64,
        )
    )
    prefix = torch.randint(0, 50, (shared,), generator=gen).tolist()
    accepted = []
    for n in lengths:
        seq = Sequence(
            prefix + torch.randint(0, 50, (n,), generator=gen).tolist(),
            SamplingParams(max_tokens=max_tokens, ignore_eos=True),
            block_size=4,
        )
        try:
            scheduler.add(seq)
            accepted.append(seq)
        except ValueError:  # too large for this cache: the scheduler refuses it up front
            pass
    packer = StepPacker("cpu")
    steps = fast = 0
    while scheduler.has_unfinished and steps < 400:
        out = scheduler.schedule()
        fast += out.decode is not None
        _assert_same(packer.pack(out), out.step_inputs())
        _assert_same(packer.pack(out, block_table_width=20), out.step_inputs(block_table_width=20))
        scheduler.update(out, [7] * out.num_rows)
        steps += 1
    assert not scheduler.has_unfinished
    assert fast or max_tokens < 3 or not accepted  # fast-path steps were packed
