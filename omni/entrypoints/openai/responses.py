"""POST /v1/responses: OpenAI's Responses API, text in and text out.

`input` is a string (one user message) or a list of messages (`input_text`, `input_image` parts;
an assistant's earlier `output_text`), `instructions` the system message; they are framed as
/v1/chat/completions frames messages and run to the text stage (the talker and vocoder never
run). `text.format` takes chat's response formats (`json_object`, `json_schema` with its schema
inline: structured output). The reply is one `message` output item with one `output_text` part;
streamed, it comes as the API's events: `response.created`, `response.in_progress`,
`response.output_item.added`, `response.content_part.added`, `response.output_text.delta` per
piece, `response.output_text.done`, `response.content_part.done`, `response.output_item.done`,
then `response.completed` (or `response.incomplete` when `max_output_tokens` cut it), each with
its `sequence_number`.

Nothing is stored (`store` is accepted and ignored), so `previous_response_id` is refused, as are
tools, reasoning, `include` and background mode: each a 400 naming the field.
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
from omni.entrypoints.openai.errors import bad_request, from_exception
from omni.entrypoints.openai.prompts import chat_prompt
from omni.entrypoints.openai.protocol import ResponsesRequest
from omni.entrypoints.snapshot_cursor import SnapshotCursor
from omni.messages import OmniOutput

ENDPOINT = "/v1/responses"
_PART_TYPES = {"input_text": "text", "output_text": "text", "input_image": "image_url"}


def messages_of(body: ResponsesRequest) -> list[dict[str, Any]]:
    """The request's input as chat messages (instructions first, as the system message)."""
    out: list[dict[str, Any]] = []
    if body.instructions:
        out.append({"role": "system", "content": body.instructions})
    if isinstance(body.input, str):
        return [*out, {"role": "user", "content": body.input}]
    for i, message in enumerate(body.input):
        if isinstance(message.content, str):
            out.append({"role": message.role, "content": message.content})
            continue
        parts = []
        for j, part in enumerate(message.content):
            param = f"input[{i}].content[{j}]"
            field = "image_url" if part.type == "input_image" else "text"
            value = getattr(part, field)
            if value is None:
                raise bad_request(f"{param}.{field} is required", f"{param}.{field}")
            if part.type == "input_image":
                parts.append({"type": "image_url", "image_url": {"url": value}})
            else:
                parts.append({"type": "text", "text": value})
        out.append({"role": message.role, "content": parts})
    return out


async def create(ctx: Context, request: Request, body: ResponsesRequest) -> Response:
    ctx.check_model(body.model)
    for name, served in (
        ("tools", not body.tools),
        ("tool_choice", body.tool_choice in (None, "none", "auto")),
        ("previous_response_id", body.previous_response_id is None),
        ("reasoning", not body.reasoning),
        ("include", not body.include),
        ("background", not body.background),
    ):
        if not served:
            raise bad_request(
                f"{name}: not supported by omni's /v1/responses (text in and out, nothing "
                "stored); use /v1/chat/completions for tools",
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
        except Exception as e:
            error = from_exception(e)
            param = (error.param or "").replace("response_format.json_schema", "text.format")
            raise bad_request(error.message.replace("response_format.json_schema", "text.format"),
                              param.replace("response_format", "text.format")) from None  # fmt: skip
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
    prompt = chat_prompt(ctx.async_omni.prompt_processor, messages_of(body), ctx.args)
    if body.cache_salt is not None:
        prompt["cache_salt"] = body.cache_salt
    reply = Reply(ctx, body, text_stage)
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

    def __init__(self, ctx: Context, body: ResponsesRequest, text_stage: str) -> None:
        self.ctx, self.body, self.text_stage = ctx, body, text_stage
        self.id = new_id("resp").replace("-", "_")
        self.item_id = new_id("msg").replace("-", "_")
        self.created_at = int(time.time())
        self.sequence_number = 0

    def whole(self, out: OmniOutput | None, text: str = "", status: str | None = None) -> dict:
        """The response object: in progress (out None), or finished with `out`."""
        if out is not None:
            text = SnapshotCursor(self.text_stage).text(out)
            cut = streaming.finish_reason(out, self.text_stage) == "length"
            status = "incomplete" if cut else "completed"
        status = status or "in_progress"
        output = (
            []
            if out is None
            else [self._item(text, "completed" if status == "completed" else "incomplete")]
        )
        counts = streaming.usage(self.ctx.async_omni, out, self.text_stage) if out else None
        body = self.body
        return {
            "id": self.id, "object": "response", "created_at": self.created_at, "status": status,
            "model": self.ctx.args.model_name, "output": output, "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": body.instructions, "max_output_tokens": body.max_output_tokens,
            "temperature": body.temperature, "top_p": body.top_p, "metadata": body.metadata or {},
            "parallel_tool_calls": True, "tool_choice": "auto", "tools": [], "store": False,
            "text": body.text or {"format": {"type": "text"}}, "truncation": body.truncation or "disabled",
            "previous_response_id": None, "reasoning": None, "user": body.user,
            "usage": None if counts is None else {
                "input_tokens": counts["prompt_tokens"],
                "input_tokens_details": counts["prompt_tokens_details"],
                "output_tokens": counts["completion_tokens"],
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": counts["total_tokens"]},
        }  # fmt: skip

    def _item(self, text: str, status: str) -> dict[str, Any]:
        part = {"type": "output_text", "text": text, "annotations": []}
        return {"type": "message", "id": self.item_id, "status": status, "role": "assistant",
                "content": [part]}  # fmt: skip

    def _event(self, kind: str, **fields: Any) -> bytes:
        event = {"type": kind, "sequence_number": self.sequence_number, **fields}
        self.sequence_number += 1
        return streaming.sse(event)

    async def events(self, outputs: Any, timer: Any) -> AsyncIterator[bytes]:
        """The streamed events; a failure after the status was sent is an `error` event."""
        where = {"item_id": self.item_id, "output_index": 0}
        cursor, last, ok = SnapshotCursor(self.text_stage), None, False
        try:
            yield self._event("response.created", response=self.whole(None))
            yield self._event("response.in_progress", response=self.whole(None))
            yield self._event("response.output_item.added", output_index=0,
                              item=self._item("", "in_progress"))  # fmt: skip
            empty = {"type": "output_text", "text": "", "annotations": []}
            yield self._event("response.content_part.added", **where, content_index=0, part=empty)
            async with contextlib.aclosing(outputs) as snapshots:
                async for last in snapshots:
                    timer.output()
                    piece = cursor.advance(streaming.check(last) if last.finished else last).text
                    if piece:
                        timer.first_token()
                        yield self._event("response.output_text.delta", **where,
                                          content_index=0, delta=piece, logprobs=[])  # fmt: skip
            out = streaming.check(last)
            final = self.whole(out)
            item = final["output"][0]
            text = item["content"][0]["text"]
            yield self._event("response.output_text.done", **where, content_index=0, text=text,
                              logprobs=[])  # fmt: skip
            yield self._event("response.content_part.done", **where, content_index=0,
                              part=item["content"][0])  # fmt: skip
            yield self._event("response.output_item.done", output_index=0, item=item)
            kind = "response.completed" if final["status"] == "completed" else "response.incomplete"
            ok = True
            yield self._event(kind, response=final)
        except Exception as e:  # noqa: BLE001 - the status is sent: report in the stream
            yield self._event("error", **from_exception(e).body()["error"])
        finally:
            timer.done(ok=ok)
