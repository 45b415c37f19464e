"""Chat's `tools` and `tool_choice`: function calls the reply is constrained to make.

- A named choice, `{"type": "function", "function": {"name": ...}}`: the reply is that
  function's arguments, the text stage's tokens constrained to JSON of its `parameters` schema
  (SamplingParams.json_schema, omni/core/json_schema.py's subset); finish_reason "stop", as
  OpenAI answers a named choice.
- "required": the reply is one call of any of the tools, `{"name": ..., "arguments": ...}` as
  Qwen's Hermes calls are spelled (omni/core/json_schema.py, TOOL_CALL), its arguments
  constrained to that tool's schema once its name is out; finish_reason "tool_calls". One call
  (as with `parallel_tool_calls: false`).
- "auto" (OpenAI's default with tools): a free reply, read for calls in the form the server's
  `--tool-call-parser` names (args.py's TOOL_CALL_PARSERS: hermes_calls.py for Qwen's form,
  whole_calls.py for Llama's JSON and pythonic forms); finish_reason
  "tool_calls" when it made one. With `--tool-call-parser none` it is a 400 naming
  `tool_choice`, as vLLM answers without a parser.
- "none" (or no tools): a plain reply, the tools left out of the prompt.

A forced call is the message's `tool_calls` (content null); streamed, the call's id and name come
in its first `delta.tool_calls`, then its arguments as they come (`CallCursor`). The tools go to
the model's chat template.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from omni.core.json_schema import TOOL_CALL, call_parts, compile_schema
from omni.entrypoints.openai.args import TOOL_CALL_PARSERS
from omni.entrypoints.openai.context import new_id
from omni.entrypoints.openai.errors import bad_request
from omni.entrypoints.openai.hermes_calls import HermesCalls
from omni.entrypoints.openai.whole_calls import WholeCalls

_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
NO_PARAMETERS = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class ToolCall:
    """The call a reply makes: `name`'s arguments (a named choice), or any tool's (None); or
    the calls a free reply makes (json_schema None: tool_choice "auto")."""

    name: str | None
    json_schema: str | None  # for SamplingParams.json_schema
    tools: list[dict[str, Any]]  # every tool, for the chat template
    max_calls: int | None = None  # a free reply's (parallel_tool_calls false: 1)
    parser: str = "hermes"  # a free reply's form of calls (TOOL_CALL_PARSERS)

    def cursor(self) -> CallCursor | HermesCalls | WholeCalls:
        """A choice's reader of its reply."""
        if self.json_schema is None:
            names = [tool["function"]["name"] for tool in self.tools]
            if self.parser == "hermes":
                return HermesCalls(names, self.max_calls)
            return WholeCalls(self.parser, names, self.max_calls)
        return CallCursor(self)

    def parts(self, text: str, whole: bool) -> tuple[str, str] | None:
        """(name, arguments) of the reply's text so far (None: the name is not out yet); for a
        `whole` reply all of its arguments, else as far as they can be known to be."""
        if self.name is not None:
            return self.name, text
        parts = call_parts(text)
        if parts is None:
            return None
        return (parts[0], parts[1].rstrip()) if whole else parts

    def finish_reason(self, reason: str) -> str:
        return "tool_calls" if self.name is None and reason == "stop" else reason


class CallCursor:
    """One streamed choice's call: the `delta.tool_calls` each new piece of text adds."""

    def __init__(self, call: ToolCall) -> None:
        self.call = call
        self.id = "call_" + new_id("")[1:25]  # OpenAI's form: call_ and 24 characters
        self.text = ""
        self.sent: str | None = None  # the arguments streamed so far (None: nothing yet)

    @property
    def started(self) -> bool:
        """Whether a call has begun: always, the whole reply is the call."""
        return True

    def message(self, text: str) -> dict[str, Any]:
        """The whole message's content (none) and call."""
        name, arguments = self.call.parts(text, whole=True) or ("", "")
        call = {"id": self.id, "type": "function",
                "function": {"name": name, "arguments": arguments}}  # fmt: skip
        return {"content": None, "tool_calls": [call]}

    def finish_reason(self, reason: str) -> str:
        return self.call.finish_reason(reason)

    def delta(self, new_text: str, whole: bool = False) -> dict[str, Any] | None:
        """The delta of `new_text` (None: nothing to send yet); `whole`: the reply is complete
        (the first piece is sent even with empty arguments)."""
        self.text += new_text
        parts = self.call.parts(self.text, whole)
        if parts is None:
            return None
        name, arguments = parts
        if self.sent is None:
            self.sent = arguments
            return {"tool_calls": [{"index": 0, "id": self.id, "type": "function",
                    "function": {"name": name, "arguments": arguments}}]}  # fmt: skip
        if not arguments.startswith(self.sent) or len(arguments) == len(self.sent):
            return None
        piece, self.sent = arguments[len(self.sent) :], arguments
        return {"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}


def tool_call(
    tools: list[dict[str, Any]] | None,
    tool_choice: Any,
    parser: str = "hermes",
    parallel_tool_calls: bool | None = None,
) -> ToolCall | None:
    """The call `tool_choice` asks for (None: a plain reply); `parser` reads a free reply's
    calls ("none": "auto" is refused). A 400 naming the field of a malformed tool or choice, or
    of one omni does not serve."""
    functions = [_function(tool, f"tools[{i}]") for i, tool in enumerate(tools or [])]
    if tool_choice is None:
        tool_choice = "auto" if functions else "none"
    if tool_choice == "none" or (tool_choice == "auto" and not functions):
        return None
    if tool_choice == "auto":
        if parser == "none":
            raise bad_request(
                "tool_choice: 'auto' (the default with tools) needs a parser of calls in free "
                "text, and this server runs with --tool-call-parser none; send 'required', a "
                "named function ({'type': 'function', 'function': {'name': ...}}) or 'none'",
                "tool_choice",
                "unsupported_value",
            )
        if parser not in TOOL_CALL_PARSERS:
            raise ValueError(f"parser must be one of {TOOL_CALL_PARSERS}, got {parser!r}")
        max_calls = 1 if parallel_tool_calls is False else None
        return ToolCall(None, None, list(tools or []), max_calls, parser)
    if tool_choice == "required":
        if not functions:
            raise bad_request("tool_choice: 'required' needs tools", "tool_choice")
        schemas = {f["name"]: _parameters(f, i) for i, f in enumerate(functions)}
        return ToolCall(None, json.dumps({TOOL_CALL: schemas}, sort_keys=True), list(tools or []))
    if not (isinstance(tool_choice, dict) and tool_choice.get("type") == "function"):
        raise bad_request(
            "tool_choice: 'none', 'auto', 'required' or {'type': 'function', 'function': "
            "{'name': ...}}, "
            f"got {tool_choice!r}",
            "tool_choice",
        )
    name = (tool_choice.get("function") or {}).get("name")
    index = next((i for i, f in enumerate(functions) if f["name"] == name), None)
    if index is None:
        known = [f["name"] for f in functions]
        raise bad_request(
            f"tool_choice.function.name: {name!r} is not one of the tools: {known}",
            "tool_choice.function.name",
        )
    schema = _parameters(functions[index], index)
    return ToolCall(functions[index]["name"], json.dumps(schema, sort_keys=True), list(tools or []))


def _parameters(function: dict[str, Any], index: int) -> dict[str, Any]:
    """A function's parameters schema, checked against the subset served."""
    schema = function.get("parameters") or NO_PARAMETERS
    try:
        compile_schema(schema, f"tools[{index}].function.parameters")
    except ValueError as e:
        raise bad_request(str(e), str(e).split(":")[0], "unsupported_value") from None
    return schema


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
