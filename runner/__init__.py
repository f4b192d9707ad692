"""Serving runner (paged KV cache, continuous batching, prefix caching, CUDA graphs, OpenAI server).

Built on `kernels/`; not yet implemented (tracked as its own issue).
"""
