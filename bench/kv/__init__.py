"""KV-cache benchmarks and launch sweeps (reference/kv, kernels/): one module per op family."""
