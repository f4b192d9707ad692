"""The FastAPI app: /v1/completions, /v1/chat/completions, /v1/models, /health, /metrics, and /openapi.json.

FastAPI rather than Starlette with pydantic by hand: the request bodies are validated by the same pydantic models
(runner.server.request_models) from which /openapi.json is generated, and the routes declare their response
models (runner.server.response_models), so the published schema cannot drift from what the server checks and
sends; it is what vLLM's OpenAI server is written in; and it is Starlette underneath, so the SSE response, the
exception handlers and the uvicorn launcher stay as they were. Responses are built through the response models
and sent as they are (no second validation by FastAPI); the interactive docs pages are off (they load their
scripts from a CDN).

Every error leaves as an OpenAI-style body {"error": {message, type, param, code}}: pydantic's validation errors
(400, param = the field's path, runner.server.errors), the rules that need the model (runner.server.protocol:
404 for an unknown model, 400s), unknown routes and methods (404/405), a server still loading its model or
draining (503), a dead engine (500/503) and anything unexpected (500, logged). A body that is not a JSON object
is refused before FastAPI parses it, saying exactly why (not UTF-8, malformed, nested too deeply). The app
serves from before the model is loaded: until the launcher attaches the loaded engine, /health answers 503
{"status": "loading"} and /v1/* and /metrics answer 503 with code "model_loading" (before the body is read), so
a client polling a starting server gets an answer instead of a connection that hangs for the whole load.
/health: 200 once loaded while the engine runs and the server is not draining, else 503 with the reason.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import sys
import threading
import uuid

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.routing import APIRoute
from pydantic.json_schema import models_json_schema
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse, Response

from runner.server import protocol, streaming
from runner.server.bridge import AsyncEngine
from runner.server.choices import Choices
from runner.server.errors import APIError, from_validation
from runner.server.logprobs import TokenTexts
from runner.server.metrics import Metrics
from runner.server.protocol import Limits
from runner.server.request_models import ChatCompletionRequest, CompletionRequest
from runner.server.response_models import (
    ChatCompletion,
    ChatCompletionChunk,
    Completion,
    ErrorBody,
    Health,
    ModelCard,
    ModelList,
)
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
    stream_interval: int = 1  # a stream's tokens per chunk (--stream-interval)

    @property
    def loading(self) -> bool:
        return self.bridge is None or self.limits is None

    @functools.cached_property
    def texts(self) -> TokenTexts | None:
        """Tokens' texts for logprobs (cached by id for the server's life)."""
        return TokenTexts(self.tokenizer) if self.tokenizer is not None else None

    def faults(self) -> frozenset[str]:
        return self.bridge.faults if self.bridge is not None else frozenset()

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
SHUTTING_DOWN = APIError(503, "the server is shutting down", kind="service_unavailable", code="shutting_down")


def error_response(err: APIError, headers: dict | None = None) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=headers)


def _errors(*statuses: int) -> dict:
    return {status: {"model": ErrorBody, "description": "an OpenAI-style error"} for status in statuses}


def _ref(model) -> dict:
    return {"$ref": f"#/components/schemas/{model.__name__}"}


def _generation_responses(model, chunk) -> dict:
    # Each server-sent event of a stream (Open API 3.1: `schema` of text/event-stream describes one event): its
    # data is a chunk (JSON), an error body (JSON), or the final [DONE].
    event = {
        "type": "object",
        "required": ["data"],
        "properties": {
            "data": {
                "anyOf": [
                    {"const": "[DONE]"},
                    {
                        "type": "string",
                        "contentMediaType": "application/json",
                        "contentSchema": {"anyOf": [_ref(chunk), _ref(ErrorBody)]},
                    },
                ]
            }
        },
    }
    return {
        200: {
            "model": model,
            "content": {"text/event-stream": {"schema": event}},
            "description": "the completion, or with stream: true its chunks as server-sent events, then [DONE]",
        },
        **_errors(400, 404, 500, 503),
    }


def _openapi(app: FastAPI, model_names: tuple[str, ...]) -> dict:
    """FastAPI's schema, less the 422 responses it documents for every route with a body (validation errors are
    sent as 400s here, as OpenAI sends them), plus the stream chunks' models, which only the events' schema
    names, and the served model names as the `model` field's values (any other name is a 404)."""
    if app.openapi_schema is None:
        schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
        for path in schema["paths"].values():
            for operation in path.values():
                operation.get("responses", {}).pop("422", None)
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        for name in ("HTTPValidationError", "ValidationError"):
            components.pop(name, None)
        _, extra = models_json_schema(
            [(ChatCompletionChunk, "serialization"), (Completion, "serialization")],
            ref_template="#/components/schemas/{model}",
        )
        for name, definition in extra.get("$defs", {}).items():
            components.setdefault(name, definition)
        for request in ("CompletionRequest", "ChatCompletionRequest"):
            if model_names:
                components[request]["properties"]["model"]["enum"] = list(model_names)
        app.openapi_schema = schema
    return app.openapi_schema


def build_app(state: ServerState) -> FastAPI:
    def available() -> None:
        if state.draining:
            raise SHUTTING_DOWN
        if state.loading:
            raise LOADING

    class BodyRoute(APIRoute):
        """A route whose body is checked before FastAPI parses it: 503 while loading or draining (before the body
        is even read), then a 400 saying why a body is not a JSON object."""

        def get_route_handler(self):
            handler = super().get_route_handler()

            async def checked(request: Request) -> Response:
                available()
                protocol.parse_json(await request.body())  # the body is kept: FastAPI reads it again from memory
                return await handler(request)

            return checked

    def send(whole) -> Response:
        if "usage_as_string" in state.faults():  # planted fault: a field of the wrong type
            body = whole.model_dump(mode="json")
            body["usage"]["completion_tokens"] = str(body["usage"]["completion_tokens"])
            return JSONResponse(body)
        return Response(whole.model_dump_json(), media_type="application/json")

    async def generate(request: Request, req: CompletionRequest | ChatCompletionRequest, chat: bool) -> Response:
        if not chat and req.echo and "crash_on_echo" in state.faults():
            raise RuntimeError("planted fault crash_on_echo")
        job = (protocol.chat_input if chat else protocol.completion_input)(req, state.limits, state.tokenizer)
        if state.draining:  # again: the body may have been uploading when the shutdown began
            raise SHUTTING_DOWN
        request_id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        # a stream wakes for every `stream_interval` tokens, a whole response for its finish only
        wake = state.stream_interval if job.stream else sys.maxsize
        choices = Choices(state.bridge, request_id, job, wake)
        await choices.accepted()
        shape = Shape(request_id, job.model, chat)
        if job.stream:
            return streaming.EventStream(choices, shape, job, state.texts, state.stream_interval)
        whole = await streaming.collect(choices, shape, job, state.texts, request.receive)
        if whole is None:  # the client left; nobody reads this
            return Response(status_code=499)
        return send(whole)

    app = FastAPI(
        title="touchstone",
        version="0.1.0",
        description="OpenAI-compatible completions and chat completions over the touchstone engine.",
        docs_url=None,
        redoc_url=None,
    )
    # the served names are known from the command line, before the model loads (the schema is built on demand)
    app.openapi = lambda: _openapi(app, state.model_names)

    async def completions(body: CompletionRequest, request: Request) -> Response:
        return await generate(request, body, chat=False)

    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        return await generate(request, body, chat=True)

    for path, endpoint, model, chunk in (
        ("/v1/completions", completions, Completion, Completion),
        ("/v1/chat/completions", chat_completions, ChatCompletion, ChatCompletionChunk),
    ):
        app.router.add_api_route(
            path,
            endpoint,
            methods=["POST"],
            response_model=None,
            responses=_generation_responses(model, chunk),
            route_class_override=BodyRoute,
        )

    @app.get("/v1/models", response_model=ModelList, responses=_errors(503))
    async def models() -> Response:
        available()
        data = [
            ModelCard(id=name, created=0, owned_by="touchstone", max_model_len=state.limits.max_model_len)
            for name in state.limits.model_names
        ]
        return Response(ModelList(data=data).model_dump_json(), media_type="application/json")

    @app.get(
        "/health",
        response_model=Health,
        responses={503: {"model": Health, "description": "loading, draining, or the engine is dead"}},
    )
    async def health() -> Response:
        if state.draining:
            status = "draining"
        elif state.loading:
            state.health_polled.set()
            status = "loading"
        elif not state.bridge.alive:
            status = "engine dead"
        else:
            status = "ok"
        return JSONResponse({"status": status}, status_code=200 if status == "ok" else 503)

    @app.get(
        "/metrics",
        response_class=Response,
        responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}, **_errors(503)},
    )
    async def metrics() -> Response:
        available()
        return Response(state.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.exception_handler(APIError)
    async def on_api_error(request: Request, err: APIError) -> Response:
        return error_response(err)

    @app.exception_handler(RequestValidationError)
    async def on_validation_error(request: Request, err: RequestValidationError) -> Response:
        return error_response(from_validation(list(err.errors()), prefix=("body",)))

    @app.exception_handler(HTTPException)
    async def on_http_error(request: Request, err: HTTPException) -> Response:
        kind = "not_found_error" if err.status_code == 404 else "invalid_request_error"
        message = f"{request.method} {request.url.path}: {err.detail}"
        return error_response(APIError(err.status_code, message, kind=kind), getattr(err, "headers", None))

    @app.exception_handler(Exception)
    async def on_error(request: Request, err: Exception) -> Response:
        log.exception("unhandled error in %s %s", request.method, request.url.path)
        return error_response(APIError(500, f"internal error: {type(err).__name__}: {err}", kind="server_error"))

    return app
