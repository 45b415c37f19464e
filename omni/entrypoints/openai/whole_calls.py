"""WholeCalls: function calls that are a whole free reply (tool_choice "auto"), in the forms
Llama models write them (`--tool-call-parser llama3_json` or `pythonic`):

    llama3_json (Llama 3.1 / 3.2):  {"name": "get_weather", "parameters": {"city": "Paris"}}
                                    (or "arguments"; several separated by ";"; a leading
                                    <|python_tag|> is dropped)
    pythonic (Llama 3.2 / 4):       [get_weather(city="Paris"), get_time()]

In these forms a reply either is its calls or is text: one that (after leading whitespace)
opens as calls do and reads whole as calls, each naming one of the request's tools with
literal keyword arguments (pythonic) or an arguments object (llama3_json), is those calls and
has no content; any other reply, a JSON object that names no tool included, is content as
written. With `parallel_tool_calls: false` calls after the first are dropped.

Streamed, a reply that opens as calls do is held back to its end (whether it is calls is known
only then) and a reply that does not streams as content from its first character. Streamed
pieces join to exactly the whole reply's message, for every split of its text.
"""

from __future__ import annotations

import ast
import json
from typing import Any

from omni.entrypoints.openai.hermes_calls import call_entry

PYTHON_TAG = "<|python_tag|>"
OPENINGS = {"llama3_json": ("{", PYTHON_TAG), "pythonic": ("[",)}


class WholeCalls:
    """One choice's reply read for calls: `delta` per new piece of text, `message` whole."""

    def __init__(self, form: str, tool_names: list[str], max_calls: int | None = None) -> None:
        if form not in OPENINGS:
            raise ValueError(f"WholeCalls: form must be one of {sorted(OPENINGS)}, got {form!r}")
        self.form = form
        self.tool_names = set(tool_names)
        self.max_calls = max_calls  # None: any number (parallel_tool_calls)
        self.pending = ""  # text read but not yet sent
        self.held: bool | None = None  # the reply opens as calls do (None: not known yet)
        self.calls: list[dict[str, Any]] = []

    @property
    def started(self) -> bool:
        """Whether the reply may be calls (it opened as calls do)."""
        return bool(self.held)

    def delta(self, new_text: str, whole: bool = False) -> dict[str, Any] | None:
        """What `new_text` adds: {"content": ...} or {"tool_calls": [...]} (None: nothing to
        send yet); `whole`: the reply ends here."""
        self.pending += new_text
        if self.held is None:
            head = self.pending.lstrip()
            openings = OPENINGS[self.form]
            if any(head.startswith(o) for o in openings):
                self.held = True
            elif not whole and any(o.startswith(head) for o in openings):
                return None  # whitespace, or the start of an opening
            else:
                self.held = False
        if self.held and not whole:
            return None
        text, self.pending = self.pending, ""
        calls = self._calls(text) if self.held else None
        if calls is None:
            return {"content": text} if text else None
        self.calls = calls[: self.max_calls] if self.max_calls is not None else calls
        return {"tool_calls": [{"index": i, **call} for i, call in enumerate(self.calls)]}

    def message(self, text: str) -> dict[str, Any]:
        """The whole reply's `content` and `tool_calls` (read afresh)."""
        reader = WholeCalls(self.form, sorted(self.tool_names), self.max_calls)
        reader.delta(text, whole=True)
        if not reader.calls:
            return {"content": text}
        self.calls = reader.calls
        return {"content": None, "tool_calls": reader.calls}

    def finish_reason(self, reason: str) -> str:
        return "tool_calls" if self.calls and reason == "stop" else reason

    def _calls(self, text: str) -> list[dict[str, Any]] | None:
        """The calls `text` is (None: it is not calls of the tools, all of it)."""
        if self.form == "pythonic":
            return _python_calls(text.strip(), self.tool_names)
        return _json_calls(text.lstrip().removeprefix(PYTHON_TAG), self.tool_names)


def _json_calls(text: str, tool_names: set[str]) -> list[dict[str, Any]] | None:
    """Calls `{"name": ..., "parameters": {...}}` separated by ";" (llama3_json)."""
    decoder, calls, pos = json.JSONDecoder(), [], 0
    while True:
        try:
            value, pos = decoder.raw_decode(text, pos)
        except ValueError:
            return None
        call = call_entry(value, tool_names, ("parameters", "arguments"))
        if call is None:
            return None
        calls.append(call)
        rest = text[pos:].lstrip()
        if not rest:
            return calls
        if not rest.startswith(";"):
            return None
        rest = rest[1:].lstrip()
        if not rest:
            return calls
        pos = len(text) - len(rest)


def _python_calls(text: str, tool_names: set[str]) -> list[dict[str, Any]] | None:
    """A Python list of calls with literal keyword arguments (pythonic): never evaluated, only
    its literals are read."""
    try:
        tree = ast.parse(text, mode="eval").body
    except (SyntaxError, ValueError):
        return None
    if not isinstance(tree, ast.List) or not tree.elts:
        return None
    calls = []
    for node in tree.elts:
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)) or node.args:
            return None
        arguments: dict[str, Any] = {}
        for keyword in node.keywords:
            if keyword.arg is None:  # **kwargs
                return None
            try:
                arguments[keyword.arg] = ast.literal_eval(keyword.value)
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                return None
        try:
            text_arguments = json.dumps(arguments, ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError):  # sets, bytes, complex numbers, inf: no JSON
            return None
        call = call_entry({"name": node.func.id, "arguments": text_arguments}, tool_names)
        if call is None:
            return None
        calls.append(call)
    return calls
