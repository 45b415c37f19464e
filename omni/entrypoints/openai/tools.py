"""Chat's `tools` and `tool_choice`: a named function call, the way vLLM serves tools by default.

`tool_choice: {"type": "function", "function": {"name": ...}}` makes the reply that function's
arguments: the text stage's tokens are constrained to JSON of its `parameters` schema
(SamplingParams.json_schema, omni/core/json_schema.py's subset), and the message carries them as
`tool_calls` (content null; finish_reason "stop", as OpenAI answers a named choice). The tools go
to the model's chat template (`tools=`), which renders them where it knows how. `tool_choice:
"none"` (or no tools) is a plain reply, the tools left out of the prompt. "auto" and "required"
(OpenAI's default with tools is "auto") need a model-specific parser of tool calls in free text,
which omni does not have: a 400 naming `tool_choice`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from omni.core.json_schema import compile_schema
from omni.entrypoints.openai.context import new_id
from omni.entrypoints.openai.errors import bad_request

_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
NO_PARAMETERS = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class ToolCall:
    """The function a reply calls (its arguments are the reply's text)."""

    name: str
    json_schema: str  # its parameters, for SamplingParams.json_schema
    tools: list[dict[str, Any]]  # every tool, for the chat template

    def message_call(self, call_id: str, arguments: str) -> dict[str, Any]:
        return {"id": call_id, "type": "function",
                "function": {"name": self.name, "arguments": arguments}}  # fmt: skip


def tool_call(tools: list[dict[str, Any]] | None, tool_choice: Any) -> ToolCall | None:
    """The named call `tool_choice` asks for (None: a plain reply); a 400 naming the field of
    a malformed tool or choice, or of one omni does not serve."""
    functions = [_function(tool, f"tools[{i}]") for i, tool in enumerate(tools or [])]
    if tool_choice is None:
        tool_choice = "auto" if functions else "none"
    if tool_choice == "none":
        return None
    if tool_choice in ("auto", "required"):
        default = " (the default with tools)" if tool_choice == "auto" else ""
        raise bad_request(
            f"tool_choice: {tool_choice!r}{default} is not served: omni has no parser of tool "
            "calls in free text; name the function ({'type': 'function', 'function': {'name': "
            "...}}) or send 'none'",
            "tool_choice",
            "unsupported_value",
        )
    if not (isinstance(tool_choice, dict) and tool_choice.get("type") == "function"):
        raise bad_request(
            f"tool_choice: 'none' or {{'type': 'function', 'function': {{'name': ...}}}}, got "
            f"{tool_choice!r}",
            "tool_choice",
        )
    name = (tool_choice.get("function") or {}).get("name")
    chosen = next((f for f in functions if f["name"] == name), None)
    if chosen is None:
        known = [f["name"] for f in functions]
        raise bad_request(
            f"tool_choice.function.name: {name!r} is not one of the tools: {known}",
            "tool_choice.function.name",
        )
    schema = chosen.get("parameters") or NO_PARAMETERS
    index = functions.index(chosen)
    path = f"tools[{index}].function.parameters"
    try:
        compile_schema(schema, path)
    except ValueError as e:
        raise bad_request(str(e), str(e).split(":")[0], "unsupported_value") from None
    return ToolCall(chosen["name"], json.dumps(schema, sort_keys=True), list(tools or []))


def _function(tool: Any, path: str) -> dict[str, Any]:
    if not isinstance(tool, dict) or tool.get("type") != "function":
        raise bad_request(f"{path}.type: only 'function' tools are served", f"{path}.type")
    function = tool.get("function")
    if not isinstance(function, dict):
        raise bad_request(f"{path}.function: an object is required", f"{path}.function")
    name = function.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise bad_request(
            f"{path}.function.name: 1 to 64 letters, digits, '_' or '-', got {name!r}",
            f"{path}.function.name",
        )
    parameters = function.get("parameters")
    if parameters is not None and not isinstance(parameters, dict):
        raise bad_request(
            f"{path}.function.parameters: a JSON schema object, got {parameters!r}",
            f"{path}.function.parameters",
        )
    return function


def new_call_id() -> str:
    return "call_" + new_id("")[1:25]  # OpenAI's form: call_ and 24 characters
