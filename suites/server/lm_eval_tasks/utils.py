"""The items of the touchstone lm-eval tasks, read from items.jsonl next to this file (no download, no dataset
cache): 60 hand-written questions, 30 of arithmetic ("2 + 3 =" -> " 5") and 30 of capital cities ("The capital of
France is" -> " Paris"), each with four choices (the answer among three near misses) for the log-likelihood task,
and the same question in words with its one-word answer for the generation task."""

from __future__ import annotations

import json
import pathlib

ITEMS = pathlib.Path(__file__).with_name("items.jsonl")


def load_items(**kwargs) -> dict:
    import datasets

    rows = [json.loads(line) for line in ITEMS.read_text().splitlines() if line.strip()]
    return {"test": datasets.Dataset.from_list(rows)}
