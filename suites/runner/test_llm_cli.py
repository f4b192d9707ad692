"""`touchstone generate` in a subprocess (the `touchstone` entry point is bench.cli:main): prints the greedy
completion of the default model on the CPU, the same text the LLM API gives in-process. Also the
incremental detokenizer against the real tokenizer (multi-byte characters split across tokens, stop strings
straddling tokens)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from runner import LLM, SamplingParams
from runner.engine.detokenizer import Detokenizer
from suites.runner.conftest import require_model_packages

ROOT = pathlib.Path(__file__).resolve().parents[2]
PROMPT = "The capital of France is"

pytestmark = pytest.mark.usefixtures("single_thread")


def test_touchstone_generate_prints_the_greedy_completion(smollm2):
    require_model_packages()
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-m", "bench.cli", "generate", PROMPT, "--max-tokens", "8", "--device", "cpu"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    want = (
        LLM(device="cpu", loaded=smollm2)
        .generate(PROMPT, SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)[0]
        .text
    )
    assert want.strip() and done.stdout == want + "\n"


def test_generate_subcommand_is_listed_in_touchstone_help():
    from bench.cli import parser

    assert "generate" in parser().format_help()


def test_incremental_text_equals_the_whole_decode(smollm2):
    tokenizer = smollm2[1]
    text = " Café naïve — 東京 🚀 done."
    ids = tokenizer.encode(text, add_special_tokens=False)
    detok = Detokenizer(tokenizer, tokenizer.encode("Say:", add_special_tokens=False))
    pieces = [detok.add(t) for t in ids]
    assert "".join(pieces) == detok.text == tokenizer.decode(ids) == text
    assert "" in pieces  # some token ended inside a multi-byte character and waited for the next


@pytest.mark.parametrize("stop", ["東京", "é n", "🚀 d", "."])
def test_stop_string_matches_across_tokens(smollm2, stop):
    tokenizer = smollm2[1]
    text = " Café naïve — 東京 🚀 done."
    detok = Detokenizer(tokenizer, [1], stop=[stop, "never"])
    emitted = "".join(detok.add(token) for token in tokenizer.encode(text, add_special_tokens=False))
    assert detok.stopped_by == stop and detok.text == text[: text.find(stop)]
    # what was emitted piece by piece (what a stream sends) never included the part of a stop string that
    # arrived before the rest of it: "é n" starts inside "Café", emitted before " n" arrives without the hold-back
    assert emitted + detok.flush() == detok.text
