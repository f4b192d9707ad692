"""OpenAI-compatible HTTP server over the runner's engine (`touchstone serve`).

- protocol:  request bodies -> validated inputs (prompt token ids + SamplingParams), or an `APIError` (4xx).
- responses: the JSON shapes sent back (completion, chat completion, their stream chunks, errors).
- bridge:    `AsyncEngine`: one thread steps the engine while any request is live; each request gets an
             asyncio queue of text deltas; aborts (client gone, shutdown) go through the same thread.
- streaming: the SSE response, which watches for the client's disconnect and aborts the request.
- metrics:   the Prometheus registry behind /metrics.
- app:       the Starlette routes (503 "loading" until the model is attached).
- launcher:  bind first, run uvicorn without its signal capture while the model loads on a thread of its own,
             our SIGINT/SIGTERM drain, engine watchdog.
- cli:       `touchstone serve` options, checked before the model loads.
Imports stay light until the bind: `touchstone serve` reports a port in use before torch is imported.
"""
