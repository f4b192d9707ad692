"""Shared fixtures of the runner suites: the real default model, loaded once per session (CPU, fp32).

`smollm2` = runner.model.load_model("smollm2-135m-instruct") -> (model, tokenizer, config); LLM(loaded=...)
builds engines over it without reloading. `one_thread` runs a module's model tests with one intra-op thread:
the model is 576 wide, so an op is microseconds of work that a second OpenMP thread only synchronizes with,
and on the shared 2-core CI box the spinning threads starve each other (measured: 4 decode steps 7.3 s with
2 threads under load 7, 0.65 s with one).
"""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="session")
def smollm2():
    from runner.model import load_model

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return load_model("smollm2-135m-instruct", dtype=torch.float32, device="cpu")
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
