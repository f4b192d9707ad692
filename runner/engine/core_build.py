"""Building an engine core from an `EngineConfig`: load the model, size the KV cache, build the scheduler and the
model runner. The same config builds the core in-process (`LLM`) or in an engine-core process, where it
arrives as a msgspec message.

KV-cache size: on CUDA, `gpu_memory_utilization` of the device minus what the weights and one warm-up step
of the full token budget use (its forward, the logits of max_num_seqs rows and a top-k/top-p sample of them),
minus, with CUDA graphs, that warm-up's activation peak once more as the graphs' pool reserve
(runner.engine.kv_sizing); on CPU a fixed `kv_cache_bytes` (256 MiB default). `num_kv_blocks` overrides both
(tests force preemption with a tiny cache).
"""

from __future__ import annotations

import msgspec
import torch

from runner.engine import kv_sizing
from runner.engine.capture_sizes import capture_sizes
from runner.engine.core import EngineCore
from runner.engine.model_runner import ModelRunner, allocate_kv, cache_spec
from runner.engine.prefill_graphs import prefill_capture_sizes
from runner.engine.sampling_params import SamplingParams
from runner.engine.scheduler import Scheduler, SchedulerConfig
from runner.model import DEFAULT_MODEL

CPU_KV_CACHE_BYTES = 256 * 2**20


class EngineConfig(msgspec.Struct, kw_only=True):
    """Everything an engine core is built from (the keyword arguments of `LLM`, minus `loaded`)."""

    model: str = DEFAULT_MODEL
    load_format: str = "auto"
    # Quantize an unquantized checkpoint while it loads (runner.model.quant): "fp8" | "fp8_block" | "mxfp4" | "nvfp4"
    quantization: str | None = None
    nvfp4_w13_policy: str = "use_w1"  # NVFP4 checkpoints' gate/up global scales (reference.quant.nvfp4_fused_w13)
    # Keep this many GiB of decoder-layer weights in host memory (runner.model.offload): copied ahead of use
    # ("prefetch", offload_prefetch_step layers ahead) or read there by the device ("uva")
    cpu_offload_gb: float = 0.0
    offload_backend: str = "prefetch"
    offload_prefetch_step: int = 1
    dtype: str | None = None  # "float32" | "bfloat16" | "float16"; None: bf16 on CUDA, fp32 on the CPU
    device: str | None = None  # None: CUDA when present, else the CPU
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    max_num_batched_tokens: int | None = None
    max_num_seqs: int = 256
    max_model_len: int = 4096
    block_size: int = 16
    gpu_memory_utilization: float = 0.9
    kv_cache_bytes: int | None = None
    num_kv_blocks: int | None = None
    enforce_eager: bool = False
    # Steps with prompt tokens as CUDA-graph replays too, padded to token buckets (runner.engine.prefill_graphs);
    # False: those steps run eagerly and only decode steps replay graphs.
    cuda_graph_prefill: bool = True
    # Schedule and prepare step N+1 while the device runs step N (runner.engine.core); False: one step at a time.
    async_scheduling: bool = True
    # Pure decode steps through the scheduler's decode fast path (runner.engine.decode_schedule); False: every
    # step through the general path (the same tokens: the equivalence tests compare both).
    decode_fast_path: bool = True
    time_phases: bool = False
    seed: int = 0

    def resolved(self) -> EngineConfig:
        """Device and dtype made explicit."""
        device = self.device or ("cuda" if torch.cuda.is_available() else "cpu")
        dtype = self.dtype or ("float32" if torch.device(device).type == "cpu" else "bfloat16")
        return msgspec.structs.replace(self, device=device, dtype=dtype)


def build_core(config: EngineConfig, loaded: tuple | None = None, tokenizer: bool = True):
    """(EngineCore, (model, tokenizer or None, model config)). `loaded`: an already loaded (model, tokenizer,
    config) from runner.model.load_model (tests build several engines over one model); it must match the
    config's dtype and device. tokenizer=False: the core needs none (an engine-core process)."""
    config = config.resolved()
    device, dtype = config.device, getattr(torch, config.dtype)
    torch.manual_seed(config.seed)  # unseeded sampling starts from the same state
    if loaded is None:
        from runner.model import load_model

        loaded = load_model(
            config.model,
            config.load_format,
            dtype,
            device,
            config.seed,
            tokenizer=tokenizer,
            quantization=config.quantization,
            nvfp4_w13_policy=config.nvfp4_w13_policy,
        )
    model, tok, model_config = loaded
    from runner.model.offload import OffloadConfig, create_offloader

    offload = OffloadConfig(config.cpu_offload_gb, config.offload_backend, config.offload_prefetch_step)
    offloader = create_offloader(offload)
    if offloader is not None:  # the weights are final; the CUDA graphs (ModelRunner) capture its copies
        offloader.post_init(model)
    max_model_len = min(config.max_model_len, getattr(model_config, "max_position_embeddings", config.max_model_len))
    max_tokens = config.max_num_batched_tokens
    if max_tokens is None:
        max_tokens = max(8192, config.max_num_seqs, 0 if config.enable_chunked_prefill else max_model_len)
    cuda = torch.device(device).type == "cuda"
    sizes = capture_sizes(config.max_num_seqs, max_tokens) if cuda and not config.enforce_eager else []
    # Prefill graphs need the attention kernels (bf16/fp16), which read their metadata from device tensors
    kernels = dtype in (torch.bfloat16, torch.float16)
    prefill_sizes = prefill_capture_sizes(max_tokens) if sizes and kernels and config.cuda_graph_prefill else []
    num_blocks = config.num_kv_blocks
    if num_blocks is None:
        num_blocks = size_kv(model, model_config, config, dtype, max_tokens, max_model_len, bool(sizes))
    eos = tok.eos_token_id if tok is not None else model_config.eos_token_id
    scheduler_config = SchedulerConfig(  # validated before anything is allocated
        num_blocks=num_blocks,
        block_size=config.block_size,
        max_num_batched_tokens=max_tokens,
        max_num_seqs=config.max_num_seqs,
        max_model_len=max_model_len,
        enable_chunked_prefill=config.enable_chunked_prefill,
        enable_prefix_caching=config.enable_prefix_caching,
        eos_token_ids=() if eos is None else (eos,),
        async_scheduling=config.async_scheduling,
        decode_fast_path=config.decode_fast_path,
    )
    # The model runner before the scheduler: it allocates the KV cache, so a cache that does not fit fails
    # before the scheduler builds a block pool of that size.
    runner = ModelRunner(
        model,
        model_config,
        num_blocks=num_blocks,
        block_size=config.block_size,
        dtype=dtype,
        device=device,
        max_model_len=max_model_len,
        capture_sizes=sizes,
        prefill_sizes=prefill_sizes,
        max_num_seqs=config.max_num_seqs,
        enforce_eager=config.enforce_eager,
        max_logits_rows=config.max_num_seqs,
    )
    scheduler = Scheduler(scheduler_config)
    core = EngineCore(scheduler, runner, model_config.vocab_size, time_phases=config.time_phases)
    return core, loaded


def size_kv(model, model_config, config: EngineConfig, dtype, max_tokens: int, max_model_len: int, graphs: bool):
    block_size, max_seqs, device = config.block_size, config.max_num_seqs, config.device
    block_bytes = kv_sizing.bytes_per_block(cache_spec(model_config, block_size, dtype), model_config.num_hidden_layers)
    most = max_seqs * -(-max_model_len // block_size) + 1  # every sequence at full length, + the null block
    if torch.device(device).type != "cuda" or config.kv_cache_bytes is not None:
        budget = config.kv_cache_bytes if config.kv_cache_bytes is not None else CPU_KV_CACHE_BYTES
        return kv_sizing.num_kv_blocks(budget, 0, 1.0, block_bytes, most)
    before = torch.cuda.memory_allocated(device)  # the weights
    warm_up(model, model_config, dtype, device, block_size, max_tokens, max_seqs, max_model_len)
    total, used = kv_sizing.measured_usage(device, before if graphs else None)
    return kv_sizing.num_kv_blocks(total, used, config.gpu_memory_utilization, block_bytes, most)


@torch.inference_mode()
def warm_up(model, model_config, dtype, device, block_size: int, max_tokens: int, max_seqs: int, max_model_len: int):
    """The activation peak the KV sizing must leave room for: one prefill forward of the whole token budget
    (in a throw-away cache of just its blocks, which the peak then also counts: conservative by that
    much), the logits of max_seqs rows and the sampler's largest temporaries on them (temperature, top-k
    and top-p: a sort of the logits with int64 indices, cumulative sums, the race), under a forked RNG so
    the warm-up draws nothing from the generator that unseeded requests use."""
    from runner.engine.sampler import SamplingBatch, sample

    torch.cuda.reset_peak_memory_stats(device)
    input_ids, positions, batch, num_blocks = warmup_batch(block_size, max_tokens, max_model_len, device)
    _, kv = allocate_kv(model_config, num_blocks, block_size, dtype, device)
    hidden = model(input_ids, positions, batch, kv)
    logits = model.compute_logits(hidden[:1].expand(max_seqs, -1).contiguous())
    del hidden
    params = SamplingParams(temperature=1.0, top_k=max(1, model_config.vocab_size // 2), top_p=0.9)
    with torch.random.fork_rng(devices=[device] if torch.device(device).type == "cuda" else []):
        sample(logits, SamplingBatch.build([params] * max_seqs, model_config.vocab_size, device))
    del kv, logits
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()  # the KV buffer is one allocation: cached warm-up segments cannot serve it


def warmup_batch(block_size: int, max_tokens: int, max_model_len: int, device):
    """The largest prefill step: max_tokens tokens as sequences of min(max_tokens, max_model_len) tokens each
    (token 0 at positions 0..n-1), each in its own run of blocks 1, 2, ... (block 0 is the null block).
    Returns (input_ids, positions, AttentionBatch, blocks the cache needs)."""
    from runner.model.attention import AttentionBatch

    per = min(max_tokens, max_model_len)
    seqs = max(1, max_tokens // per)
    blocks = -(-per // block_size)
    table = (1 + torch.arange(seqs * blocks, dtype=torch.int32, device=device)).view(seqs, blocks)
    position = torch.arange(per, device=device)
    slots = (table[:, position // block_size].to(torch.int64) * block_size + position % block_size).flatten()
    cu = torch.arange(seqs + 1, dtype=torch.int32, device=device) * per
    batch = AttentionBatch(
        slot_mapping=slots,
        block_table=table,
        seq_lens=torch.full((seqs,), per, dtype=torch.int32, device=device),
        cu_seqlens_q=cu,
        is_decode=per == 1,
        logits_indices=(cu[1:] - 1).to(torch.int64),
    )
    input_ids = torch.zeros(seqs * per, dtype=torch.int64, device=device)
    return input_ids, position.repeat(seqs), batch, 1 + seqs * blocks
