"""GEMM references: precision-mirroring and ideal definitions of the quantized matmuls."""
