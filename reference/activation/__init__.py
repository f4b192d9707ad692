"""Activations of the decoder's MLP: SiLU-and-mul on the fused gate/up projection."""
