"""Normalization layers of the decoder: RMSNorm, alone and fused with the residual add."""
