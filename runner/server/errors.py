"""OpenAI-style errors: `APIError`, raised anywhere in the server and sent as
{"error": {"message", "type", "param", "code"}}, and the translation of pydantic's validation errors into it.

A validation error becomes a 400 invalid_request_error whose `param` is the path of the field at fault, written
as OpenAI writes it ("messages[0].role", "stream_options.include_usage"), and whose message starts with that
path. pydantic reports every error it found; the first (in field order) is the one sent, as OpenAI sends one.
`code` is the status when there is no more specific code (as vLLM does).
"""

from __future__ import annotations

import json


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        kind: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind

    def body(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code if self.code is not None else self.status,
            }
        }


def bad(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, param)


def param_path(loc: tuple) -> str:
    """("messages", 0, "role") -> "messages[0].role"."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _shown(value) -> str:
    try:
        text = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):  # bytes (a body that is not JSON), NaN, ...
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def from_validation(errors: list[dict], prefix: tuple = ()) -> APIError:
    """The first of pydantic's errors (`ValidationError.errors()`, or FastAPI's, whose locations start with
    "body": `prefix`) as a 400 naming the field."""
    error = errors[0]
    loc = tuple(error.get("loc", ()))
    loc = loc[len(prefix) :] if loc[: len(prefix)] == prefix else loc
    if not loc:  # the body itself: absent, or not an object
        if error.get("type") == "missing":
            return bad("body: required, a JSON object")
        return bad("body: must be a JSON object, sent with content-type: application/json")
    param = param_path(loc)
    if error.get("type") == "missing":
        return bad(f"{param}: required", param)
    msg = error.get("msg", "invalid")
    msg = msg[0].lower() + msg[1:] if msg else "invalid"
    return bad(f"{param}: {msg}, got {_shown(error.get('input'))}", param)
