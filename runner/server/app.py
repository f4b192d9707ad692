"""The Starlette app: /v1/completions, /v1/chat/completions, /v1/models, /health, /metrics.

Every error leaves as an OpenAI-style body {"error": {message, type, param, code}}: validation (protocol),
unknown routes and methods (404/405), a server still loading its model or draining (503), a dead engine
(500/503) and anything unexpected (500, logged). The app serves from before the model is loaded: until the
launcher attaches the loaded engine, /health answers 503 {"status": "loading"} and /v1/* and /metrics answer
503 with code "model_loading", so a client polling a starting server gets an answer instead of a connection
that hangs for the whole load. /health: 200 once loaded while the engine thread runs and the server is not
draining, else 503 with the reason ("loading", "draining", "engine dead").
"""

from __future__ import annotations

import dataclasses
import logging
import threading
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
    """What the routes read. A state built without a bridge is loading: `attach` gives it the loaded engine."""

    bridge: AsyncEngine | None = None
    tokenizer: object | None = None
    limits: Limits | None = None
    metrics: Metrics | None = None
    model_names: tuple[str, ...] = ()
    draining: bool = False
    load_error: BaseException | None = None  # why the model failed to load (the server then exits)
    # set when /health has answered "loading" once (the planted fault load_after_health waits for it)
    health_polled: threading.Event = dataclasses.field(default_factory=threading.Event)

    @property
    def loading(self) -> bool:
        return self.bridge is None or self.limits is None

    def attach(self, loaded: ServerState) -> None:
        """Take the loaded state's bridge, tokenizer, limits and metrics (on the event loop's thread, in one go:
        no handler sees half of them)."""
        self.tokenizer, self.metrics, self.model_names = loaded.tokenizer, loaded.metrics, loaded.model_names
        self.bridge, self.limits = loaded.bridge, loaded.limits


LOADING = APIError(
    503,
    "the model is still loading; retry once /health answers 200",
    kind="service_unavailable",
    code="model_loading",
)


def error_response(err: APIError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status)


def build_app(state: ServerState) -> Starlette:
    async def generate(request: Request, chat: bool) -> Response:
        if state.draining:
            raise APIError(503, "the server is shutting down", kind="service_unavailable", code="shutting_down")
        if state.loading:
            raise LOADING
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
        if state.loading:
            raise LOADING
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
        if state.draining:
            return JSONResponse({"status": "draining"}, status_code=503)
        if state.loading:
            state.health_polled.set()
            return JSONResponse({"status": "loading"}, status_code=503)
        if not state.bridge.alive:
            return JSONResponse({"status": "engine dead"}, status_code=503)
        return JSONResponse({"status": "ok"})

    async def metrics(request: Request) -> Response:
        if state.loading:
            raise LOADING
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
