"""End-to-end benchmarks of the serving runner: `runner.LLM` throughput against transformers on fixed
workloads (the package is not named bench/runner because bench/runner.py is the op benchmarks' runner)."""
