"""A real client not written here: lm-evaluation-harness against `touchstone serve --dtype float32 --device cpu`,
on the repo's own tasks (suites/server/lm_eval_tasks: 60 hand-written items, read from a local JSONL file).

- Log-likelihood (touchstone_loglik, multiple choice): lm-eval's `local-completions` model sends each context +
  choice as token ids with echo, logprobs 1 and max_tokens 1, and sums the continuation's echoed logprobs. The
  same task through lm-eval's own `hf` model (transformers on the same GGUF, fp32) must give the same accuracy,
  every item's log-likelihoods within 1e-3 and the same is_greedy flags.
- Generation (touchstone_gen, exact match): `local-chat-completions` (the server applies the chat template)
  against `hf` with lm-eval's chat template: the same greedy answers, item by item, so the same score.

local-completions splits context from continuation with a tokenizer: the HF tokenizer of the same GGUF, saved to
a folder (lm-eval loads it by path, offline). The CPU tier only: it is an fp32 comparison with transformers on
the CPU. Nothing here measures speed; the timeouts bound a hang.
"""

from __future__ import annotations

import importlib.util
import json
import pathlib
import subprocess
import sys

import pytest

from runner.server.process import ROOT, server_env
from suites.runner.conftest import require_model_packages, skip_or_fail
from suites.server.conftest import start_server

MODEL = "smollm2-135m-instruct"
LOGLIK_TOLERANCE = 1e-3
RUN_TIMEOUT_S = 900  # a bound against hanging: a process's two evaluations take 30-70 s on 2 cores


def _require_lm_eval() -> None:
    missing = [n for n in ("lm_eval", "aiohttp", "tenacity", "requests") if importlib.util.find_spec(n) is None]
    if missing:
        skip_or_fail(f"the lm-eval comparison needs {', '.join(missing)} (pip install -e .[dev]: lm-eval[api])")


@pytest.fixture(scope="module")
def setup(request, tmp_path_factory):
    if request.config.getoption("--device") != "cpu":
        pytest.skip("the fp32 comparison with transformers runs in the CPU tier")
    _require_lm_eval()
    require_model_packages()
    from transformers import AutoTokenizer

    from runner.model.source import gguf_path

    folder = tmp_path_factory.mktemp("lm-eval")
    gguf = gguf_path(MODEL)
    tokenizer = folder / "tokenizer"
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(tokenizer)
    server = start_server("cpu", folder, "--dtype", "float32")
    try:
        yield server.wait_ready(), gguf, tokenizer, folder
    finally:
        server.stop()


def _start(folder, name: str, jobs: list[dict]) -> tuple[subprocess.Popen, pathlib.Path]:
    out = folder / f"{name}.json"
    env = server_env(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1")
    command = [sys.executable, "-m", "suites.server.lm_eval_run", str(out), json.dumps(jobs)]
    return subprocess.Popen(command, cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True), out


def _finish(started: tuple[subprocess.Popen, pathlib.Path]) -> dict:
    process, out = started
    try:
        _, stderr = process.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        process.kill()
    assert process.returncode == 0, stderr[-4000:]
    return json.loads(out.read_text())


def _job(name: str, model: str, task: str, model_args: dict, chat: bool = False, batch_size: int = 1) -> dict:
    return {
        "name": name,
        "model": model,
        "model_args": model_args,
        "task": task,
        "chat": chat,
        "batch_size": batch_size,
    }


@pytest.fixture(scope="module")
def evaluations(setup) -> dict:
    """Both tasks through the server, and both through transformers (one weights load), the two processes
    running side by side."""
    server, gguf, tokenizer, folder = setup
    loglik_args = _server_args(server, "completions", tokenizer_backend="huggingface", tokenizer=str(tokenizer))
    ours = _start(
        folder,
        "server",
        [
            _job("loglik", "local-completions", "touchstone_loglik", loglik_args),
            _job("gen", "local-chat-completions", "touchstone_gen", _server_args(server, "chat/completions"), True),
        ],
    )
    hf = _start(
        folder,
        "hf",
        [
            _job("loglik", "hf", "touchstone_loglik", _hf_args(gguf), batch_size=16),
            _job("gen", "hf", "touchstone_gen", _hf_args(gguf), True, batch_size=16),
        ],
    )
    return {"ours": _finish(ours), "hf": _finish(hf)}


def _server_args(server, endpoint: str, **extra) -> dict:
    return {"model": server.model, "base_url": f"{server.base_url}/v1/{endpoint}", "num_concurrent": 4, **extra}


def _hf_args(gguf) -> dict:
    return {"pretrained": str(gguf.parent), "gguf_file": gguf.name, "dtype": "float32", "device": "cpu"}


def test_loglikelihood_server_equals_hf(evaluations):
    ours, hf = evaluations["ours"]["loglik"], evaluations["hf"]["loglik"]
    assert len(ours["samples"]) == len(hf["samples"]) == 60
    worst, flags = 0.0, 0
    for a, b in zip(ours["samples"], hf["samples"], strict=True):
        assert a["doc_id"] == b["doc_id"] and len(a["filtered"]) == len(b["filtered"]) == 4
        for (ll_a, greedy_a), (ll_b, greedy_b) in zip(a["filtered"], b["filtered"], strict=True):
            worst = max(worst, abs(ll_a - ll_b))
            flags += greedy_a != greedy_b
    assert worst <= LOGLIK_TOLERANCE, f"largest per-item log-likelihood difference {worst:.3g}"
    assert flags == 0
    assert ours["results"]["acc,none"] == hf["results"]["acc,none"], (ours["results"], hf["results"])


def test_generation_chat_server_equals_hf(evaluations):
    ours, hf = evaluations["ours"]["gen"], evaluations["hf"]["gen"]
    answers = [s["resps"][0][0] for s in ours["samples"]]
    assert answers == [s["resps"][0][0] for s in hf["samples"]]
    score = ours["results"]["exact_match,answer"]
    assert score == hf["results"]["exact_match,answer"] and score > 0, (ours["results"], hf["results"])
