"""GEMM references: a precision-mirroring one (what the kernel computes) and an ideal one per format."""
