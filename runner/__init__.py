"""Serving runner: `from runner import LLM, SamplingParams`.

runner.model: model definitions and loaders (Llama from GGUF / safetensors / dummy weights; the tiny hybrid).
runner.engine: block pool, prefix caching, scheduler, sampler, model runner, decode CUDA graphs, engine loop.
runner.llm: the offline API; runner.cli: `touchstone generate`.
Imports are lazy so that `import runner.model...` does not pull in the engine (and the reverse).
"""

from __future__ import annotations

__all__ = ["LLM", "RequestOutput", "SamplingParams"]


def __getattr__(name: str):
    if name == "LLM":
        from runner.llm import LLM

        return LLM
    if name == "SamplingParams":
        from runner.engine.sampling_params import SamplingParams

        return SamplingParams
    if name == "RequestOutput":
        from runner.engine.output_processor import RequestOutput

        return RequestOutput
    raise AttributeError(f"module 'runner' has no attribute {name!r}")
