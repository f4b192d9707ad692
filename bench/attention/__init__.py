"""Attention benchmarks and launch sweeps (reference/attention, kernels/): one module per op family."""
