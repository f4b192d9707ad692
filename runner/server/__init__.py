"""OpenAI-compatible HTTP server over the runner's engine (`touchstone serve`).

- request_models:  the request bodies as pydantic models (types, ranges; /openapi.json is generated from them).
- protocol:        validated requests -> inputs (prompt token ids, one SamplingParams per choice), or an
                   `APIError` (4xx): the rules that need the model (names, context, KV cache, vocabulary).
- errors:          `APIError` and pydantic's validation errors as OpenAI-style error bodies naming the field.
- response_models: the JSON bodies sent back, as pydantic models; responses: one request's objects and SSE.
- bridge:          `AsyncEngine`: the frontend of the engine-core process; each request gets a queue of deltas.
- choices:         the n engine requests of one API request, read together (deltas of a stream that fell
                   behind joined into one piece per choice).
- pieces, logprobs: what a choice sends (echo, the prompt alone), logprobs in OpenAI's two formats.
- streaming:       the SSE response (tokens per chunk: --stream-interval), watching for the client's disconnect.
- metrics:         the Prometheus registry behind /metrics.
- app:             the FastAPI routes (503 "loading" until the model is attached), /openapi.json.
- launcher:        bind first, run uvicorn without its signal capture while the model loads on a thread of its own,
                   our SIGINT/SIGTERM drain, engine watchdog.
- cli:             `touchstone serve` options, checked before the model loads.
Imports stay light until the bind: `touchstone serve` reports a port in use before torch is imported.
"""
