"""One benchmark point: streamed completions against the server, timed on the client (perf_counter).

Per request, as `vllm bench serve` measures: TTFT = first token-bearing chunk - send;
ITL = the gaps between consecutive token-bearing chunks (the server sends one chunk per engine step that gave
the request tokens, the last one carrying the finish_reason); E2EL = the [DONE] - send; output tokens from the
final usage chunk (`stream_options.include_usage`); TPOT = (E2EL - TTFT) / (output tokens - 1), only for
requests with more than one token. Traffic: a fixed number of concurrent clients each sending its next request
as soon as the previous one ended (`concurrency`), or Poisson arrivals at `rate` requests/s (`rate`).
The client is aiohttp in one asyncio loop, as `vllm bench serve`'s (httpx's per-chunk cost made the client,
not the server, the bottleneck at 256 streams on the H200).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import time

import aiohttp

# A stream silent this long is a hung server, not a slow one: the point fails instead of waiting forever
# (the slowest legitimate gap is a CPU prefill of a whole batch, seconds).
READ_TIMEOUT_S = 300.0


@dataclasses.dataclass
class RequestResult:
    ok: bool
    prompt_tokens: int = 0
    output_tokens: int = 0
    ttft: float = 0.0
    e2el: float = 0.0
    itl: list[float] = dataclasses.field(default_factory=list)
    error: str = ""

    @property
    def tpot(self) -> float | None:
        return (self.e2el - self.ttft) / (self.output_tokens - 1) if self.output_tokens > 1 else None


async def one_request(
    session: aiohttp.ClientSession, url: str, model: str, prompt: list[int], output_len: int
) -> RequestResult:
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": output_len,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    out = RequestResult(ok=False)
    last = None
    try:
        async with session.post(url, json=body) as response:
            if response.status != 200:
                out.error = f"HTTP {response.status}: {(await response.read())[:200]!r}"
                return out
            async for raw in response.content:  # one SSE line at a time
                if not raw.startswith(b"data: "):
                    continue
                now = time.perf_counter()
                if raw.startswith(b"data: [DONE]"):
                    out.e2el = now - start
                    out.ok = out.output_tokens > 0
                    break
                data = json.loads(raw[6:])
                if "error" in data:
                    out.error = str(data["error"].get("message"))
                    return out
                if data.get("usage"):
                    out.prompt_tokens = data["usage"]["prompt_tokens"]
                    out.output_tokens = data["usage"]["completion_tokens"]
                if data.get("choices"):
                    if last is None:
                        out.ttft = now - start
                    else:
                        out.itl.append(now - last)
                    last = now
    except (aiohttp.ClientError, TimeoutError) as err:
        out.error = f"{type(err).__name__}: {err}"
    return out


async def run_point(
    url: str,
    model: str,
    prompts: list[list[int]],
    output_len: int,
    *,
    concurrency: int | None = None,
    rate: float | None = None,
    seed: int = 0,
) -> tuple[list[RequestResult], float]:
    """All prompts through the server at the given concurrency or arrival rate; (results, wall seconds)."""
    timeout = aiohttp.ClientTimeout(total=None, connect=30, sock_read=READ_TIMEOUT_S)
    # limit=0: no cap on connections (the concurrency is the cap)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as session:
        started = time.perf_counter()
        if concurrency is not None:
            todo = iter(prompts)
            results: list[RequestResult] = []

            async def worker() -> None:
                for prompt in todo:
                    results.append(await one_request(session, url, model, prompt, output_len))

            await asyncio.gather(*(worker() for _ in range(concurrency)))
        else:
            gaps = random.Random(seed)
            tasks = []
            for prompt in prompts:
                tasks.append(asyncio.ensure_future(one_request(session, url, model, prompt, output_len)))
                await asyncio.sleep(gaps.expovariate(rate))
            results = list(await asyncio.gather(*tasks))
        return results, time.perf_counter() - started


def random_prompts(count: int, input_len: int, seed: int, low: int = 1000, high: int = 20000) -> list[list[int]]:
    """Random token ids (vLLM's `random` dataset shape: fixed input length, ignore_eos). Ids in [1000, 20000):
    inside any registered vocabulary, away from the special tokens at the start of SmolLM2's. Random ids make a
    block shared between two prompts (a prefix-cache hit) practically impossible."""
    rng = random.Random(seed)
    return [[rng.randrange(low, high) for _ in range(input_len)] for _ in range(count)]
