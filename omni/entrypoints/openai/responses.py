"""POST /v1/responses: OpenAI's Responses API, text in and out, with function calls.

`input` is a string (one user message) or a list of items: messages (`input_text`, `input_image`
parts; an assistant's earlier `output_text`), earlier `function_call`s and their
`function_call_output`s; `instructions` is the system message. They are framed as
/v1/chat/completions frames messages (calls as an assistant's tool calls, outputs as tool
messages) and run to the text stage (the talker and vocoder never run). `text.format` takes
chat's response formats (`json_object`, `json_schema` with its schema inline: structured
output). `tools` (the API's flat form) and `tool_choice` work as chat's: "auto" reads the reply
for calls, "required" or a named function makes it one call (flat_tools.py). The output items
and the streamed events are responses_output.py's; the stream ends with `response.completed` (or
`response.incomplete` when `max_output_tokens` cut it).

Nothing is stored (`store` is accepted and ignored), so `previous_response_id` is refused, as
are reasoning, `include` and background mode: each a 400 naming the field.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.requests import Request

from omni.entrypoints.openai import sampling, streaming
from omni.entrypoints.openai.context import Context, new_id
from omni.entrypoints.openai.errors import OpenAIError, bad_request, from_exception
from omni.entrypoints.openai.flat_tools import checked_call
from omni.entrypoints.openai.prompts import chat_prompt
from omni.entrypoints.openai.protocol import (
    ResponsesFunctionCall,
    ResponsesFunctionCallOutput,
    ResponsesRequest,
)
from omni.entrypoints.openai.responses_output import ResponseOutput
from omni.entrypoints.openai.tools import ToolCall
from omni.entrypoints.snapshot_cursor import SnapshotCursor
from omni.messages import OmniOutput

ENDPOINT = "/v1/responses"


def messages_of(body: ResponsesRequest) -> list[dict[str, Any]]:
    """The request's input as chat messages (instructions first, as the system message)."""
    out: list[dict[str, Any]] = []
    if body.instructions:
        out.append({"role": "system", "content": body.instructions})
    if isinstance(body.input, str):
        return [*out, {"role": "user", "content": body.input}]
    for i, item in enumerate(body.input):
        if isinstance(item, ResponsesFunctionCallOutput):
            out.append({"role": "tool", "content": item.output, "tool_call_id": item.call_id})
            continue
        if isinstance(item, ResponsesFunctionCall):  # joins the assistant's turn before it
            call = {"id": item.call_id, "type": "function",
                    "function": {"name": item.name, "arguments": item.arguments}}  # fmt: skip
            if not out or out[-1]["role"] != "assistant":
                out.append({"role": "assistant", "content": None})
            out[-1]["tool_calls"] = [*out[-1].get("tool_calls", []), call]
            continue
        if isinstance(item.content, str):
            out.append({"role": item.role, "content": item.content})
            continue
        parts = []
        for j, part in enumerate(item.content):
            param = f"input[{i}].content[{j}]"
            field = "image_url" if part.type == "input_image" else "text"
            value = getattr(part, field)
            if value is None:
                raise bad_request(f"{param}.{field} is required", f"{param}.{field}")
            if part.type == "input_image":
                parts.append({"type": "image_url", "image_url": {"url": value}})
            else:
                parts.append({"type": "text", "text": value})
        out.append({"role": item.role, "content": parts})
    return out


async def create(ctx: Context, request: Request, body: ResponsesRequest) -> Response:
    ctx.check_model(body.model)
    for name, served in (
        ("previous_response_id", body.previous_response_id is None),
        ("reasoning", not body.reasoning),
        ("include", not body.include),
        ("background", not body.background),
    ):
        if not served:
            raise bad_request(
                f"{name}: not supported by omni's /v1/responses (text in and out, nothing stored)",
                name,
                "unsupported_value",
            )
    text_stage = ctx.text_stage()
    fmt = (body.text or {}).get("format")
    json_schema = None
    if fmt is not None:  # the API's inline json_schema format, as chat's response_format
        if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
            fmt = {
                "type": "json_schema",
                "json_schema": {k: v for k, v in fmt.items() if k != "type"},
            }
        try:
            json_schema = sampling.json_schema_of(fmt)
        except OpenAIError as e:  # named as this API names the field

            def renamed(text: str) -> str:
                return text.replace("response_format.json_schema", "text.format").replace(
                    "response_format", "text.format"
                )

            raise bad_request(renamed(e.message), renamed(e.param or "")) from None
    call = checked_call(ctx, body.tools or [], body.tool_choice, "")
    if call is not None and call.json_schema is not None:
        if json_schema is not None:
            raise bad_request(
                "text.format: a named or required tool_choice makes the reply the call; leave "
                "text.format out (or {'type': 'text'})",
                "text.format",
            )
        json_schema = call.json_schema
    plan = sampling.plan(
        ctx.async_omni,
        text_stage,
        max_tokens=body.max_output_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        top_k=body.top_k,
        seed=body.seed,
        text_final=True,
        json_schema=json_schema,
        until_end=True,
        default_max_tokens=ctx.args.max_tokens,
    )
    tools = None if call is None else call.tools
    prompt = chat_prompt(ctx.async_omni.prompt_processor, messages_of(body), ctx.args, tools)
    if body.cache_salt is not None:
        prompt["cache_salt"] = body.cache_salt
    reply = Reply(ctx, body, text_stage, call)
    prepared = await streaming.prepare(ctx.async_omni, prompt, reply.id)
    sampling.check_context(
        ctx.async_omni, text_stage, prepared, body.max_output_tokens, "max_output_tokens"
    )
    timer = ctx.metrics.timer(ENDPOINT)
    outputs = ctx.async_omni.run(
        prepared, plan.params, final_stage=text_stage, step_snapshots=bool(body.stream)
    )
    if body.stream:
        return StreamingResponse(reply.events(outputs, timer), media_type="text/event-stream")
    try:
        out = await streaming.until_disconnected(request, streaming.collect(outputs, timer))
    except streaming.ClientGone:
        return Response(status_code=499)
    return JSONResponse(reply.whole(out))


class Reply:
    """One response: its object, whole or as the stream's events."""

    def __init__(
        self, ctx: Context, body: ResponsesRequest, text_stage: str, call: ToolCall | None
    ) -> None:
        self.ctx, self.body, self.text_stage = ctx, body, text_stage
        self.output = ResponseOutput(call)
        self.id = new_id("resp").replace("-", "_")
        self.created_at = int(time.time())

    def whole(self, out: OmniOutput) -> dict[str, Any]:
        """The finished response object (its text read as one piece)."""
        self.output.add(SnapshotCursor(self.text_stage).text(out), whole=True)
        self.output.finish(self._completed(out))  # the items' final status; no events sent
        return self._object(out, self._status(out))

    def _completed(self, out: OmniOutput) -> bool:
        return streaming.finish_reason(out, self.text_stage) != "length"

    def _status(self, out: OmniOutput) -> str:
        return "completed" if self._completed(out) else "incomplete"

    def _object(self, out: OmniOutput | None, status: str = "in_progress") -> dict[str, Any]:
        counts = None if out is None else streaming.usage(self.ctx.async_omni, out, self.text_stage)
        body = self.body
        return {
            "id": self.id, "object": "response", "created_at": self.created_at, "status": status,
            "model": self.ctx.args.model_name, "error": None,
            "output": [] if out is None else [dict(item) for item in self.output.items],
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": body.instructions, "max_output_tokens": body.max_output_tokens,
            "temperature": body.temperature, "top_p": body.top_p, "metadata": body.metadata or {},
            "parallel_tool_calls": body.parallel_tool_calls is not False,
            "tool_choice": body.tool_choice or "auto", "tools": body.tools or [], "store": False,
            "text": body.text or {"format": {"type": "text"}}, "truncation": body.truncation or "disabled",
            "previous_response_id": None, "reasoning": None, "user": body.user,
            "usage": None if counts is None else {
                "input_tokens": counts["prompt_tokens"],
                "input_tokens_details": counts["prompt_tokens_details"],
                "output_tokens": counts["completion_tokens"],
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": counts["total_tokens"]},
        }  # fmt: skip

    async def events(self, outputs: Any, timer: Any) -> AsyncIterator[bytes]:
        """The streamed events; a failure after the status was sent is an `error` event."""
        output, cursor, last, ok = self.output, SnapshotCursor(self.text_stage), None, False
        try:
            yield output.event("response.created", response=self._object(None))
            yield output.event("response.in_progress", response=self._object(None))
            async with contextlib.aclosing(outputs) as snapshots:
                async for last in snapshots:
                    timer.output()
                    piece = cursor.advance(streaming.check(last) if last.finished else last).text
                    if piece:
                        timer.first_token()
                    for event in output.add(piece):
                        yield event
            out = streaming.check(last)
            for event in output.add("", whole=True) + output.finish(self._completed(out)):
                yield event
            status = self._status(out)
            ok = True
            yield output.event(f"response.{status}", response=self._object(out, status))
        except Exception as e:  # noqa: BLE001 - the status is sent: report in the stream
            yield output.event("error", **from_exception(e).body()["error"])
        finally:
            timer.done(ok=ok)
