"""The engine core of the serving runner: sampling parameters, request state, the block pool and KV-cache
manager (prefix caching), KV sizing, the scheduler, the sampler and the decode CUDA-graph capture sizes.

Pure Python + torch: nothing here runs a model, so all of it is testable with fake tokens. One step of the
engine loop (the model runner and engine live in model_runner.py / engine.py):

    out = scheduler.schedule()                       # SchedulerOutput: rows, new tokens, slots, block table
    inp = out.step_inputs(device)                    # tensors named as runner.model.attention.AttentionBatch
    hidden = model(inp.input_ids, inp.positions, AttentionBatch(...), kv_caches)
    rows = inp.sample_mask                           # only rows whose request samples (not prompt chunks)
    logits = model.compute_logits(hidden[inp.logits_indices[rows]])
    tokens = sample(logits, SamplingBatch.from_sequences(sampling_seqs, vocab, device))
    finished = scheduler.update(out, tokens_per_row)  # one entry per row; ignored where a row does not sample
"""

from __future__ import annotations

import importlib

# name -> the submodule that defines it. Imported on first use (as in runner/__init__.py), so that
# `runner.engine.sampling_params` (pure Python) costs no torch import: the server's request validation and
# the commands' argument checks use it before anything heavy is loaded.
_HOME = {
    "capture_sizes": "capture_sizes",
    "padded_batch_size": "capture_sizes",
    "bytes_per_block": "kv_sizing",
    "measured_usage": "kv_sizing",
    "num_kv_blocks": "kv_sizing",
    "SamplingBatch": "sampler",
    "sample": "sampler",
    "SamplingParams": "sampling_params",
    "Scheduler": "scheduler",
    "SchedulerConfig": "scheduler",
    "SchedulerOutput": "scheduler",
    "StepInputs": "scheduler",
    "FinishReason": "sequence",
    "Sequence": "sequence",
    "SequenceStatus": "sequence",
}
__all__ = sorted(_HOME)


def __getattr__(name: str):
    if name not in _HOME:
        raise AttributeError(f"module 'runner.engine' has no attribute {name!r}")
    return getattr(importlib.import_module(f"runner.engine.{_HOME[name]}"), name)
