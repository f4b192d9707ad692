"""Benchmarks of the quantization ops (reference/quant, kernels/): one module per format family."""
