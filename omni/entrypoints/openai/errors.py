"""The one place an exception becomes an OpenAI error response:
`{"error": {"message", "type", "param", "code"}}` with the HTTP status OpenAI would use."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi.responses import JSONResponse

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    500: "server_error",
    503: "service_unavailable_error",
}


class OpenAIError(Exception):
    """An error for the client: status, message, the offending parameter and a short code."""

    def __init__(
        self, status: int, message: str, *, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": _TYPES.get(self.status, "invalid_request_error"),
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if self.status == 401 else None
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


def bad_request(message: str, param: str | None = None, code: str = "invalid_value") -> OpenAIError:
    return OpenAIError(400, message, param=param, code=code)


def param_path(loc: Sequence[Any]) -> str:
    """A pydantic error location as a parameter path: ("messages", 0, "content") ->
    "messages[0].content". Union member tags ("str", "list[...]", "function-after[...]") are
    dropped: they name a type tried, not a field."""
    out = ""
    skip_tag = tagged = False
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
            skip_tag, tagged = tagged, False
        elif isinstance(part, str) and _is_type_tag(part):
            tagged = part.startswith("list[tagged-union")
        elif isinstance(part, str) and skip_tag:
            skip_tag = False  # a tagged union's discriminator value, e.g. "image_url"
        elif isinstance(part, str):
            out += f".{part}" if out else part
    return out


def _is_type_tag(part: str) -> bool:
    return any(c in part for c in "[](),-") or part in {"str", "int", "float", "bool", "none"}


def from_validation_error(errors: Sequence[Any]) -> OpenAIError:
    """The most specific pydantic error (the deepest location: for a union, the member that
    matched the input's shape), naming the field and the value."""
    first = max(errors, key=lambda e: len(e.get("loc", ())))
    param = param_path(first.get("loc", ()))
    kind = first.get("type", "")
    if kind == "extra_forbidden":
        return bad_request(
            f"Unrecognized request argument supplied: {param}", param, "unknown_parameter"
        )
    if kind == "missing":
        return bad_request(
            f"Missing required parameter: {param!r}.", param, "missing_required_parameter"
        )
    value = first.get("input")
    shown = repr(value) if len(repr(value)) <= 200 else repr(value)[:200] + "..."
    message = f"Invalid value for {param!r}: {first.get('msg', 'invalid')}; got {shown}"
    return bad_request(message, param or None)


def from_exception(exc: BaseException) -> OpenAIError:
    """Anything a handler raised: ValueError (bad input found by the engine) -> 400; RuntimeError
    (a stage is down, the engine is shut down) -> 503; the rest -> 500."""
    if isinstance(exc, OpenAIError):
        return exc
    if isinstance(exc, ValueError):
        return bad_request(str(exc), _param_in(str(exc)))
    if isinstance(exc, RuntimeError):
        return OpenAIError(503, str(exc), code="stage_unavailable")
    return OpenAIError(500, f"internal error: {type(exc).__name__}: {exc}", code="internal_error")


def _param_in(message: str) -> str | None:
    """The prompt field an engine ValueError names, as far as it maps to a request parameter."""
    for key, param in (
        ("speaker", "audio.voice"),
        ("images", "messages"),
        ("audio", "messages"),
        ("cache_salt", "cache_salt"),
        ("prompt_token_ids", "prompt"),
        ("max_tokens", "max_tokens"),
    ):
        if key in message:
            return param
    return None
