"""Serving-runner suites: engine core (block pool, scheduler, sampler) with fake tokens; model and API."""
