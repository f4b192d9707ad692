"""lm-evaluation-harness evaluations of tasks of suites/server/lm_eval_tasks, in a process of their own
(lm-eval configures logging and, for its `hf` model, loads the weights: neither belongs in the pytest worker);
writes each evaluation's results and every item's responses as JSON, under the evaluation's name. Used by
test_lm_eval.py. Evaluations with the same model and arguments share one model object (one weights load).

    python -m suites.server.lm_eval_run OUT.json JOBS_JSON
    JOBS_JSON: [{"name", "model", "model_args": {...}, "task", "chat": bool, "batch_size": int}, ...]
"""

from __future__ import annotations

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
    out, jobs = pathlib.Path(argv[0]), json.loads(argv[1])
    import lm_eval
    from lm_eval.api.registry import get_model
    from lm_eval.tasks import TaskManager

    # Only this folder's tasks: indexing lm-eval's own thousands of task files took 6 s per evaluation.
    tasks = TaskManager(include_path=str(TASKS), include_defaults=False)
    models, written = {}, {}
    for job in jobs:
        key = json.dumps([job["model"], job["model_args"], job["batch_size"]], sort_keys=True)
        if key not in models:
            models[key] = get_model(job["model"]).create_from_arg_obj(
                job["model_args"], {"batch_size": job["batch_size"]}
            )
        results = lm_eval.simple_evaluate(
            model=models[key],
            tasks=[job["task"]],
            task_manager=tasks,
            apply_chat_template=job["chat"],
            log_samples=True,
        )
        samples = [
            {"doc_id": s["doc_id"], "resps": plain(s["resps"]), "filtered": plain(s["filtered_resps"])}
            for s in results["samples"][job["task"]]
        ]
        written[job["name"]] = {
            "results": plain(results["results"][job["task"]]),
            "samples": sorted(samples, key=lambda s: s["doc_id"]),
        }
    out.write_text(json.dumps(written))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
