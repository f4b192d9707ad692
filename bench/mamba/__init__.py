"""Mamba2 decode benchmarks and launch sweeps (reference/mamba, kernels/mamba_*): one module per op family."""
