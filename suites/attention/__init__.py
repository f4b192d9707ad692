"""Attention suites: paged decode."""
