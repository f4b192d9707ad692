"""The Starlette app: /v1/completions, /v1/chat/completions, /v1/models, /health, /metrics.

Every error leaves as an OpenAI-style body {"error": {message, type, param, code}}: validation (protocol),
unknown routes and methods (404/405), a draining server (503), a dead engine (500/503) and anything
unexpected (500, logged). /health: 200 while the engine thread runs and the server is not draining, else 503.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from runner.server import protocol, streaming
from runner.server.bridge import AsyncEngine
from runner.server.metrics import Metrics
from runner.server.protocol import APIError, Limits
from runner.server.responses import Shape

log = logging.getLogger("touchstone.server")


@dataclasses.dataclass
class ServerState:
    bridge: AsyncEngine
    tokenizer: object | None
    limits: Limits
    metrics: Metrics
    draining: bool = False


def error_response(err: APIError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status)


def build_app(state: ServerState) -> Starlette:
    async def generate(request: Request, chat: bool) -> Response:
        if state.draining:
            raise APIError(503, "the server is shutting down", kind="service_unavailable", code="shutting_down")
        body = protocol.parse_json(await request.body())
        parse = protocol.chat_input if chat else protocol.completion_input
        job = parse(body, state.limits, state.tokenizer)
        if state.draining:  # again: the body may have been uploading when the shutdown began
            raise APIError(503, "the server is shutting down", kind="service_unavailable", code="shutting_down")
        request_id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        stream = state.bridge.submit(request_id, job.prompt_token_ids, job.params)
        try:
            await stream.accepted
        except BaseException:
            state.bridge.abort(request_id)  # cancelled while waiting: the engine may have taken it already
            state.bridge.release(stream)
            raise
        shape = Shape(request_id, job.model, chat)
        if job.stream:
            return streaming.EventStream(state.bridge, stream, shape, job)
        whole = await streaming.collect(state.bridge, stream, shape, request.receive)
        if whole is None:  # the client left; nobody reads this
            return Response(status_code=499)
        return JSONResponse(whole)

    async def completions(request: Request) -> Response:
        return await generate(request, chat=False)

    async def chat_completions(request: Request) -> Response:
        return await generate(request, chat=True)

    async def models(request: Request) -> Response:
        data = [
            {
                "id": name,
                "object": "model",
                "created": 0,
                "owned_by": "touchstone",
                "max_model_len": state.limits.max_model_len,
            }
            for name in state.limits.model_names
        ]
        return JSONResponse({"object": "list", "data": data})

    async def health(request: Request) -> Response:
        if state.draining or not state.bridge.alive:
            return JSONResponse({"status": "draining" if state.draining else "engine dead"}, status_code=503)
        return JSONResponse({"status": "ok"})

    async def metrics(request: Request) -> Response:
        return Response(state.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    async def on_api_error(request: Request, err: APIError) -> Response:
        return error_response(err)

    async def on_http_error(request: Request, err: HTTPException) -> Response:
        kind = "not_found_error" if err.status_code == 404 else "invalid_request_error"
        return error_response(
            APIError(err.status_code, f"{request.method} {request.url.path}: {err.detail}", kind=kind)
        )

    async def on_error(request: Request, err: Exception) -> Response:
        log.exception("unhandled error in %s %s", request.method, request.url.path)
        return error_response(APIError(500, f"internal error: {type(err).__name__}: {err}", kind="server_error"))

    routes = [
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]
    return Starlette(
        routes=routes, exception_handlers={APIError: on_api_error, HTTPException: on_http_error, Exception: on_error}
    )
