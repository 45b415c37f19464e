"""A realtime session's tools (the Realtime API's flat form, {type, name, description,
parameters}) and tool_choice ({type, name} for a named one), checked as chat's
(omni/entrypoints/openai/tools.py), their errors naming the session's or response's fields."""

from __future__ import annotations

from typing import Any

from omni.entrypoints.openai.context import Context
from omni.entrypoints.openai.errors import OpenAIError, bad_request
from omni.entrypoints.openai.tools import ToolCall, tool_call


def chat_tools(tools: list[Any]) -> list[Any]:
    """Realtime's tools ({type, name, description, parameters}) in chat's form."""
    return [
        {"type": tool.get("type"), "function": {k: v for k, v in tool.items() if k != "type"}}
        if isinstance(tool, dict)
        else tool
        for tool in tools
    ]


def checked_call(ctx: Context, tools: list[Any], tool_choice: Any, where: str) -> ToolCall | None:
    """The calls a response with these tools makes (None: none); a 400 naming `where`'s field."""
    choice = tool_choice
    if isinstance(choice, dict) and choice.get("type") == "function" and "name" in choice:
        choice = {"type": "function", "function": {"name": choice["name"]}}
    try:
        return tool_call(chat_tools(tools), choice or "auto", ctx.args.tool_call_parser)
    except OpenAIError as e:
        param = (e.param or "").replace(".function.", ".").replace("function.", "")
        message = e.message.replace(".function.", ".").replace("function.name", "name")
        raise bad_request(
            f"{where}.{message}", f"{where}.{param}", e.code or "invalid_value"
        ) from e
