"""Serving-runner benchmarks: end-to-end throughput of `runner.LLM` against transformers on fixed workloads."""
