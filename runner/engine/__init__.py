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

from runner.engine.capture_sizes import capture_sizes, padded_batch_size
from runner.engine.kv_sizing import bytes_per_block, measured_usage, num_kv_blocks
from runner.engine.sampler import SamplingBatch, sample
from runner.engine.sampling_params import SamplingParams
from runner.engine.scheduler import Scheduler, SchedulerConfig, SchedulerOutput, StepInputs
from runner.engine.sequence import FinishReason, Sequence, SequenceStatus

__all__ = [
    "FinishReason",
    "SamplingBatch",
    "SamplingParams",
    "Scheduler",
    "SchedulerConfig",
    "SchedulerOutput",
    "Sequence",
    "SequenceStatus",
    "StepInputs",
    "bytes_per_block",
    "capture_sizes",
    "measured_usage",
    "num_kv_blocks",
    "padded_batch_size",
    "sample",
]
