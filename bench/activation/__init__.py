"""Benchmarks of the decoder MLP's activation: SiLU-and-mul."""
