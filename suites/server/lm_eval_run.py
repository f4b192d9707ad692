"""One lm-evaluation-harness evaluation of a task of suites/server/lm_eval_tasks, in a process of its own (lm-eval
configures logging and, for its `hf` model, loads the weights: neither belongs in the pytest worker); writes the
task's results and every item's responses as JSON. Used by test_lm_eval.py.

    python -m suites.server.lm_eval_run OUT.json MODEL TASK MODEL_ARGS_JSON [--chat] [--batch-size N]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

TASKS = pathlib.Path(__file__).with_name("lm_eval_tasks")


def plain(value):
    """numpy scalars and tuples as JSON's numbers and lists."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value.item() if hasattr(value, "item") else value


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("model")
    p.add_argument("task")
    p.add_argument("model_args")
    p.add_argument("--chat", action="store_true", help="apply the chat template (chat models, generation)")
    p.add_argument("--batch-size", type=int, default=1)
    args = p.parse_args(argv)
    import lm_eval
    from lm_eval.tasks import TaskManager

    results = lm_eval.simple_evaluate(
        model=args.model,
        model_args=json.loads(args.model_args),
        tasks=[args.task],
        task_manager=TaskManager(include_path=str(TASKS)),
        batch_size=args.batch_size,
        apply_chat_template=args.chat,
        log_samples=True,
    )
    samples = [
        {"doc_id": s["doc_id"], "resps": plain(s["resps"]), "filtered": plain(s["filtered_resps"])}
        for s in results["samples"][args.task]
    ]
    out = {"results": plain(results["results"][args.task]), "samples": sorted(samples, key=lambda s: s["doc_id"])}
    pathlib.Path(args.out).write_text(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
