"""Mixture-of-experts layer benchmarks."""
