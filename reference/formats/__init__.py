"""Element codecs: E2M1 (FP4), E8M0 (power-of-two scales), nibble packing."""
