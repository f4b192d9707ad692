"""Attention over paged KV caches: the definitions (fp64 ideal) and the precision mirrors of the kernels."""
