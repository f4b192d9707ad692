"""Benchmarks of the quantized GEMMs (reference/gemm, kernels/): one module per op family."""
