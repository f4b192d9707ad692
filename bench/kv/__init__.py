"""KV-cache benchmarks and launch sweeps."""
