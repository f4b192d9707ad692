"""GEMM benchmarks: block-FP8 W8A8 (DeepSeek-V3) first."""
