"""Rotary position embedding benchmarks."""
