"""Parity suites of the Mamba2 decode ops (reference.mamba, kernels.mamba_*)."""
