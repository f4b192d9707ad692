"""The offline `LLM` with its engine core in a process of its own (`engine_process=True`): the same tokens and
text as in-process, a refused request is a ValueError naming the field, a core that cannot start is one
EngineCoreError line, and closing stops the process."""

from __future__ import annotations

import psutil
import pytest

from runner.engine.core_client import EngineCoreError
from runner.engine.sampling_params import SamplingParams
from suites.runner.conftest import require_model_packages

PROMPTS = ["The capital of France is", "Count: one, two,", "def add(a, b):"]
SMALL = dict(device="cpu", max_num_seqs=4, max_model_len=256, kv_cache_bytes=32 << 20)


@pytest.fixture(autouse=True)
def _one_thread_core(monkeypatch):
    """The core process runs torch on one thread, as the in-process tests do (2-core CI machine)."""
    require_model_packages()
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="module")
def process_llm():
    from runner import LLM

    require_model_packages()
    with pytest.MonkeyPatch.context() as env:
        env.setenv("OMP_NUM_THREADS", "1")
        llm = LLM(engine_process=True, **SMALL)
    yield llm
    llm.close()


def test_same_tokens_and_text_as_in_process(process_llm, smollm2):
    from runner import LLM

    params = [
        SamplingParams(temperature=0, max_tokens=12),
        SamplingParams(temperature=0, max_tokens=20, stop=["four"]),
        SamplingParams(temperature=0.8, seed=7, max_tokens=12),
    ]
    local = LLM(loaded=smollm2, **SMALL).generate(PROMPTS, params, use_tqdm=False)
    remote = process_llm.generate(PROMPTS, params, use_tqdm=False)
    for want, got in zip(local, remote, strict=True):
        assert (got.token_ids, got.text, got.finish_reason, got.stop_reason) == (
            want.token_ids,
            want.text,
            want.finish_reason,
            want.stop_reason,
        )
    assert remote[1].finish_reason == "stop" and remote[1].stop_reason == "four"


def test_a_refused_request_names_the_field_and_the_core_keeps_serving(process_llm):
    with pytest.raises(ValueError, match="prompt_token_ids: token ids must be < the vocabulary size"):
        process_llm.generate([[1, 2], [10**9]], SamplingParams(max_tokens=2), use_tqdm=False)
    out = process_llm.generate("The capital of France is", SamplingParams(temperature=0, max_tokens=4), False)
    assert len(out[0].token_ids) == 4


def test_a_core_that_cannot_start_is_one_error_line(monkeypatch):
    from runner import LLM

    monkeypatch.setenv("TOUCHSTONE_CORE_FAULTS", "fail_at_start")
    with pytest.raises(EngineCoreError) as failed:
        LLM(engine_process=True, **SMALL)
    assert str(failed.value) == "RuntimeError: planted fault fail_at_start: the engine core could not be built"


def test_close_stops_the_core():
    from runner import LLM

    llm = LLM(engine_process=True, **SMALL)
    core = psutil.Process(llm.engine.core.proc.pid)
    llm.close()
    assert not core.is_running() or core.status() == psutil.STATUS_ZOMBIE
