"""`touchstone generate` in a subprocess (`python -m runner.cli`): on the default (instruct) model a plain question
goes through the chat template and prints the answer, the same text LLM.chat gives in-process; --no-chat
prints the greedy completion of the raw text, the same as LLM.generate. Also the incremental detokenizer
against the real tokenizer (multi-byte characters split across tokens, stop strings straddling tokens)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from runner import LLM, SamplingParams
from runner.engine.detokenizer import Detokenizer
from runner.server.process import ROOT, server_env
from suites.runner.conftest import require_model_packages

QUESTION = "What is the capital of France?"
PROMPT = "The capital of France is"

pytestmark = pytest.mark.usefixtures("single_thread")


def generate(*args: str) -> subprocess.CompletedProcess:
    require_model_packages()
    return subprocess.run(
        [sys.executable, "-m", "runner.cli", *args, "--device", "cpu"],
        cwd=ROOT,
        env=server_env(OMP_NUM_THREADS="1"),
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_a_question_is_answered_through_the_chat_template_by_default(smollm2):
    """Fed raw, this question's first greedy token is the end of turn: the command printed an empty line."""
    done = generate(QUESTION, "--max-tokens", "16")
    assert done.returncode == 0, done.stderr[-2000:]
    params = SamplingParams(temperature=0, max_tokens=16)
    llm = LLM(device="cpu", loaded=smollm2)
    want = llm.chat([{"role": "user", "content": QUESTION}], params, use_tqdm=False)[0].text
    assert want.strip() and done.stdout == want + "\n"
    assert "Paris" in done.stdout


def test_no_chat_prints_the_greedy_completion_of_the_raw_text(smollm2):
    done = generate(PROMPT, "--max-tokens", "8", "--no-chat")
    assert done.returncode == 0, done.stderr[-2000:]
    want = (
        LLM(device="cpu", loaded=smollm2)
        .generate(PROMPT, SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)[0]
        .text
    )
    assert want.strip() and done.stdout == want + "\n"


def test_incremental_text_equals_the_whole_decode(smollm2):
    tokenizer = smollm2[1]
    text = " Café naïve — 東京 🚀 done."
    ids = tokenizer.encode(text, add_special_tokens=False)
    detok = Detokenizer(tokenizer, tokenizer.encode("Say:", add_special_tokens=False))
    pieces = [detok.add(t) for t in ids]
    assert "".join(pieces) == detok.text == tokenizer.decode(ids) == text
    assert "" in pieces  # some token ended inside a multi-byte character and waited for the next


@pytest.mark.parametrize("per_call", [2, 3, 64])
def test_several_tokens_a_call_give_the_same_text(smollm2, per_call):
    """`extend` (a delta's tokens in one call: the output processor's path for requests without stop strings)
    emits what `add` token by token does, pieces joined."""
    tokenizer = smollm2[1]
    ids = tokenizer.encode(" Café naïve — 東京 🚀 done.", add_special_tokens=False)
    prompt = tokenizer.encode("Say:", add_special_tokens=False)
    one, many = Detokenizer(tokenizer, prompt), Detokenizer(tokenizer, prompt)
    singly = "".join(one.add(t) for t in ids)
    pieces = [many.extend(ids[i : i + per_call]) for i in range(0, len(ids), per_call)]
    assert "".join(pieces) == singly == many.text == one.text


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
