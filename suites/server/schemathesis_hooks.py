"""schemathesis hooks for suites/server/test_schemathesis.py (loaded through SCHEMATHESIS_HOOKS): keep every
generated request cheap for the engine, so a run of a few hundred cases takes a minute on two CPU cores.

Each change turns a value the schema accepts into another one it accepts, so a negative case (data the schema
rejects) stays negative and a positive one positive: max_tokens / max_completion_tokens above MAX_TOKENS become
MAX_TOKENS (and are set to it when absent: chat's default is the rest of the context), n above MAX_N becomes
MAX_N, and token ids (any int >= 0 in the schema) are folded into the vocabulary (SCHEMATHESIS_VOCAB_SIZE), so
token-id prompts reach the engine instead of a 400. `map_case` runs in both phases (coverage and fuzzing).
"""

from __future__ import annotations

import os

import schemathesis

MAX_TOKENS = 4
MAX_N = 2  # the schema's n is 1..128
VOCAB = int(os.environ.get("SCHEMATHESIS_VOCAB_SIZE", "49152"))


def _int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _ids(value) -> bool:
    return isinstance(value, list) and bool(value) and all(_int(t) and t >= 0 for t in value)


def shrink(body: dict) -> dict:
    lengths = [name for name in ("max_tokens", "max_completion_tokens") if name in body]
    for name in lengths:
        if _int(body[name]) and body[name] > MAX_TOKENS:
            body[name] = MAX_TOKENS
    if all(body.get(name) is None for name in lengths):
        body["max_completion_tokens" if "messages" in body else "max_tokens"] = MAX_TOKENS
    if _int(body.get("n")) and MAX_N < body["n"] <= 128:
        body["n"] = MAX_N
    prompt = body.get("prompt")
    if _ids(prompt):
        body["prompt"] = [t % VOCAB for t in prompt]
    elif isinstance(prompt, list) and len(prompt) == 1 and _ids(prompt[0]):
        body["prompt"] = [[t % VOCAB for t in prompt[0]]]
    return body


@schemathesis.hook
def map_case(context, case):
    if isinstance(case.body, dict):
        case.body = shrink(dict(case.body))
    return case
