"""Benchmarks: registry, timing, measured roofs and reports."""
