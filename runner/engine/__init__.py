"""The engine core of the serving runner: sampling parameters, request state, the block pool and KV-cache
manager (prefix caching), KV sizing, the scheduler, the sampler and the decode CUDA-graph capture sizes.

Pure Python + torch: nothing here runs a model, so all of it is testable with fake tokens.
"""
