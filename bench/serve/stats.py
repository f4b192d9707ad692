"""Summaries of one benchmark point, with the metric names and definitions of vLLM's `vllm bench serve`: TTFT,
TPOT (per request, over its output tokens after the first), ITL (every gap between streamed tokens), E2EL."""

from __future__ import annotations

from bench.serve.client import RequestResult
from bench.timing import quantiles


def _pct(values: list[float], q: float) -> float:
    """The q-th percentile of seconds, in ms."""
    return quantiles(values, [q / 100])[0] * 1e3


def summarize(results: list[RequestResult], seconds: float) -> dict:
    ok = [r for r in results if r.ok]
    ttft = [r.ttft for r in ok]
    tpot = [t for r in ok if (t := r.tpot) is not None]
    itl = [gap for r in ok for gap in r.itl]
    e2el = [r.e2el for r in ok]
    output = sum(r.output_tokens for r in ok)
    return {
        "requests": len(results),
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "duration_s": seconds,
        "input_tokens": sum(r.prompt_tokens for r in ok),
        "output_tokens": output,
        "req_per_s": len(ok) / seconds,
        "output_tok_per_s": output / seconds,
        "ttft_p50_ms": _pct(ttft, 50),
        "ttft_p99_ms": _pct(ttft, 99),
        "tpot_p50_ms": _pct(tpot, 50),
        "tpot_p99_ms": _pct(tpot, 99),
        "itl_p50_ms": _pct(itl, 50),
        "itl_p99_ms": _pct(itl, 99),
        "e2el_p50_ms": _pct(e2el, 50),
        "e2el_p99_ms": _pct(e2el, 99),
        "first_error": next((r.error for r in results if not r.ok), ""),
    }
