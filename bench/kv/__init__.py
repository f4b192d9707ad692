"""KV-cache benchmarks (reference/kv, kernels/): one module per op family."""
