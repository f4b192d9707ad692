"""Report rows as PyTorch OSS benchmark-database records: one JSON record per metric, so a fleet of machines can
push its results to one dashboard.

The record shape is the one documented in the PyTorch wiki ("How to integrate with PyTorch OSS benchmark
database") and emitted by vLLM's benchmarks (`convert_to_pytorch_benchmark_format`): `benchmark` (name, mode,
dtype, extra_info), `model` (name: the op or workload), `metric` (name, `benchmark_values`, extra_info),
`runners` (the device and driver), `dependencies` (torch, triton, touchstone at its commit) and a timestamp.
Written as a JSON list to <name>.pytorch.json beside the CSV.
"""

from __future__ import annotations

import json
import math
import pathlib
from collections.abc import Mapping

import pandas as pd

from bench.environment import ROW_FIELDS

SUFFIX = ".pytorch.json"
BENCHMARK = "touchstone"
# Columns that describe the machine and software rather than the measurement.
ENVIRONMENT = (*ROW_FIELDS, "transformers", "timestamp")


def _number(value: object) -> float | None:
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None  # JSON has no NaN or Inf: such a metric is left out


def _context(fields: Mapping[str, object]) -> dict:
    """The runner and dependency parts of a record, from a row's (or the environment's) fields."""
    return {
        "runners": [
            {
                "name": str(fields.get("device", "")),
                "type": " ".join(str(fields[k]) for k in ("backend", "arch") if fields.get(k)),
                "gpu_info": str(fields.get("device", "")) if fields.get("backend") not in ("cpu", None) else "",
                "extra_info": {k: str(fields[k]) for k in ("driver", "clocks_at_start", "python") if k in fields},
            }
        ],
        "dependencies": {
            "torch": {"version": str(fields.get("torch", ""))},
            "triton": {"version": str(fields.get("triton", ""))},
            "touchstone": {"sha": str(fields.get("git_sha", "")), "extra_info": {"dirty": str(fields.get("dirty"))}},
        },
        "timestamp": str(fields.get("timestamp", "")),
    }


def _record(mode: str, dtype: str, model: str, metric: str, value: float, info: dict, fields: Mapping) -> dict:
    return {
        "benchmark": {"name": BENCHMARK, "mode": mode, "dtype": dtype, "extra_info": info},
        "model": {"name": model},
        "metric": {"name": metric, "benchmark_values": [value], "extra_info": {}},
        **_context(fields),
    }


def op_records(frame: pd.DataFrame) -> list[dict]:
    """Records of tidy op rows (bench.rows): latency p50 (ms, p20/p80 and the sample count beside it), throughput
    (GB/s or TFLOP/s) and the fraction of the same-run roof, for every timed row."""
    records = []
    for row in frame.to_dict("records"):
        p50 = _number(row["p50"])
        if p50 is None:
            continue
        info = {k: str(row[k]) for k in ("impl", "shape", "x_name", "correctness", "repro_cmd")}
        info["x_value"] = _number(row["x_value"])
        info |= {"roof": row["roof_name"], "roof_value": _number(row["roof_value"])}
        metrics = {"latency_ms_p50": p50, "fraction_of_roof": _number(row["fraction_of_roof"])}
        metrics |= (
            {"gbps": _number(row["gbps"])} if row["roof_name"] == "memcpy" else {"tflops": _number(row["tflops"])}
        )
        for name, value in metrics.items():
            if value is None:
                continue
            record = _record("inference", row["dtype"], row["op"], name, value, dict(info), row)
            if name == "latency_ms_p50":
                record["metric"]["extra_info"] = {
                    "p20": _number(row["p20"]),
                    "p80": _number(row["p80"]),
                    "n_samples": _number(row["n_samples"]),
                }
            records.append(record)
    return records


def table_records(name: str, frame: pd.DataFrame, fields: Mapping[str, object]) -> list[dict]:
    """Records of a table report (runner throughput, serving): every numeric column of every row is a metric;
    the row's text columns go to the benchmark's extra_info; the environment comes from the row's own columns,
    else from `fields`."""
    records = []
    for row in frame.to_dict("records"):
        context = {**fields, **{k: row[k] for k in ENVIRONMENT if k in row}}
        numbers = {k: _number(v) for k, v in row.items() if k not in ENVIRONMENT}
        texts = {k: str(v) for k, v in row.items() if numbers.get(k) is None and k not in ENVIRONMENT}
        model = texts.get("workload") or texts.get("impl") or texts.get("mode") or name
        for metric, value in numbers.items():
            if value is not None:
                records.append(_record("inference", "", f"{name}/{model}", metric, value, dict(texts), context))
    return records


def write(path: pathlib.Path, records: list[dict]) -> None:
    path.write_text(json.dumps(records, indent=1, allow_nan=False) + "\n")


def read(path: pathlib.Path) -> list[dict]:
    return json.loads(path.read_text())
