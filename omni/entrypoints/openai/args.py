"""Settings of one server (from the `omni serve` command line)."""

from __future__ import annotations

from dataclasses import dataclass

MAX_BODY_BYTES = 32 * 1024 * 1024
TOOL_CALL_PARSERS = ("hermes", "llama3_json", "pythonic", "none")


@dataclass(frozen=True)
class ServerArgs:
    model_name: str
    """The name clients pass as `model` (--served-model-name; default: the model directory)."""
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    """When set, every /v1 request needs `Authorization: Bearer <api_key>`."""
    allowed_local_media_path: str | None = None
    """Image/audio URLs may name local files under this directory (file:// or a plain path)."""
    allow_remote_media: bool = False
    """Fetch http(s) media URLs (timeout and size limit below); rejected otherwise."""
    max_tokens: int | None = None
    """max_tokens of a request that sets none (--max-tokens); None: until the end of the
    context, as OpenAI's API does (the stage config's max_tokens is the Python API's default)."""
    tool_call_parser: str = "hermes"
    """How a reply with tool_choice "auto" is read for calls (--tool-call-parser): "hermes"
    (`<tool_call>{"name": ..., "arguments": ...}</tool_call>`, as Qwen writes them),
    "llama3_json" (`{"name": ..., "parameters": ...}`) or "pythonic" (`[f(a=1)]`), as Llama
    writes them (omni/entrypoints/openai/tools.py), or "none" ("auto" is refused)."""
    max_body_bytes: int = MAX_BODY_BYTES
    media_timeout_s: float = 10.0
    max_media_bytes: int = 20 * 1024 * 1024

    def __post_init__(self) -> None:
        if self.tool_call_parser not in TOOL_CALL_PARSERS:
            raise ValueError(
                f"ServerArgs.tool_call_parser must be one of {list(TOOL_CALL_PARSERS)}, "
                f"got {self.tool_call_parser!r}"
            )
