"""Tools in the flat form of the Responses and Realtime APIs ({type, name, description,
parameters}) and their tool_choice ({type, name} for a named one), checked as chat's
(omni/entrypoints/openai/tools.py), their errors naming the request's fields."""

from __future__ import annotations

from typing import Any

from omni.entrypoints.openai.context import Context
from omni.entrypoints.openai.errors import OpenAIError, bad_request
from omni.entrypoints.openai.tools import ToolCall, tool_call


def chat_tools(tools: list[Any]) -> list[Any]:
    """Flat tools ({type, name, description, parameters}) in chat's form."""
    return [
        {"type": tool.get("type"), "function": {k: v for k, v in tool.items() if k != "type"}}
        if isinstance(tool, dict)
        else tool
        for tool in tools
    ]


def checked_call(ctx: Context, tools: list[Any], tool_choice: Any, where: str) -> ToolCall | None:
    """The calls a response with these tools makes (None: none); a 400 naming the field, under
    `where` ("" for the request's top level)."""
    choice = tool_choice
    if isinstance(choice, dict) and choice.get("type") == "function" and "name" in choice:
        choice = {"type": "function", "function": {"name": choice["name"]}}
    try:
        return tool_call(chat_tools(tools), choice or "auto", ctx.args.tool_call_parser)
    except OpenAIError as e:
        param = (e.param or "").replace(".function.", ".").replace("function.", "")
        message = e.message.replace(".function.", ".").replace("function.name", "name")
        prefix = f"{where}." if where else ""
        raise bad_request(
            f"{prefix}{message}", f"{prefix}{param}", e.code or "invalid_value"
        ) from e
