"""GEMM benchmarks (reference/gemm, kernels/): one module per op family."""
