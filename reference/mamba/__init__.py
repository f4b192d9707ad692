"""Mamba2 references: the decode-time selective state update and causal conv1d (this package), the SSD chunked
scan and state alignment (ssd.py, align.py)."""
