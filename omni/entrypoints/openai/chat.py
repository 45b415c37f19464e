"""POST /v1/chat/completions: text, or text + audio (`modalities: ["text", "audio"]`).

`n` choices (text only for n > 1; choice j of a request with a `seed` samples with seed + j),
each its own request, sharing the prompt through the prefix cache (omni/entrypoints/openai/
chat_choice.py). Non-streaming: `message.content` is the text stage's text, `message.audio` the
vocoder's waveform `{id, data (base64 wav or pcm16), expires_at, transcript}`, from the
whole-sequence path (the waveform transformers produces). Streaming: a role chunk, the text as
the text stage generates it, the audio as the vocoder decodes it, the finish reason, an optional
usage chunk, `[DONE]`. Streamed audio runs the streaming path (the talker starts before the
thinker has finished, the vocoder decodes in chunks) and must be pcm16, as with OpenAI: each new
piece of waveform is a `delta.audio` `{id, data: base64 pcm16 of the new samples only}`, each
text piece is both `delta.content` and `delta.audio.transcript`, and a last
`delta.audio` `{id, expires_at}` closes the audio. Without audio the request ends at the text
stage: the talker and vocoder never run.
"""

from __future__ import annotations

import asyncio
import dataclasses

from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.requests import Request

from omni.entrypoints.openai import chat_choice, sampling, streaming, structured_outputs, tools
from omni.entrypoints.openai.chat_choice import ChatChoice
from omni.entrypoints.openai.context import Context, new_id
from omni.entrypoints.openai.errors import bad_request
from omni.entrypoints.openai.prompts import chat_prompt
from omni.entrypoints.openai.protocol import ChatCompletionRequest

ENDPOINT = "/v1/chat/completions"
AUDIO_FORMATS = ("wav", "pcm16")
STREAM_AUDIO_FORMAT = "pcm16"  # raw samples: any run of whole samples plays on its own
MAX_CHOICES = streaming.MAX_CHOICES


def _unsupported(body: ChatCompletionRequest) -> list[tuple[str, object, bool]]:
    """(field, value, served): OpenAI fields omni serves at their defaults only."""
    return [("store", body.store, not body.store)]


async def create(ctx: Context, request: Request, body: ChatCompletionRequest) -> Response:
    ctx.check_model(body.model)
    n = 1 if body.n is None else body.n
    if not 1 <= n <= MAX_CHOICES:
        raise bad_request(f"n: must be in [1, {MAX_CHOICES}], got {n}", "n")
    for name, value, served in _unsupported(body):
        if not served:
            raise bad_request(f"{name}: {value!r} is not supported", name, "unsupported_value")
    if body.top_logprobs and not body.logprobs:
        raise bad_request("top_logprobs: needs logprobs set to true", "top_logprobs")
    call = tools.tool_call(
        body.tools, body.tool_choice, ctx.args.tool_call_parser, body.parallel_tool_calls
    )
    json_schema = sampling.json_schema_of(body.response_format)
    if call is not None and call.json_schema is not None and json_schema is not None:
        raise bad_request(
            "response_format: a named tool_choice makes the reply the function's arguments "
            "already; leave response_format out (or {'type': 'text'})",
            "response_format",
        )
    vllm_schema = structured_outputs.requested(body)
    forced = call is not None and call.json_schema is not None
    if vllm_schema is not None and (json_schema is not None or forced):
        raise bad_request(
            "structured_outputs: the reply is already constrained by "
            + ("response_format" if json_schema is not None else "the tools' tool_choice"),
            "structured_outputs",
        )
    json_schema = json_schema or vllm_schema
    text_stage = ctx.text_stage()
    modalities = body.modalities or ["text"]
    want_audio = "audio" in modalities
    speaker = None
    if want_audio:
        ctx.require_audio("modalities")
        if body.audio is None:
            raise bad_request(
                "audio output (modalities includes 'audio') needs the audio parameter "
                "{voice, format}",
                "audio",
                "missing_required_parameter",
            )
        if body.audio.format not in AUDIO_FORMATS:
            raise bad_request(
                f"audio.format {body.audio.format!r} is not supported; formats: "
                f"{list(AUDIO_FORMATS)}",
                "audio.format",
            )
        if body.stream and body.audio.format != STREAM_AUDIO_FORMAT:
            raise bad_request(
                f"audio.format {body.audio.format!r} cannot be streamed: streamed audio "
                f"(stream: true) is {STREAM_AUDIO_FORMAT!r} only",
                "audio.format",
                "unsupported_value",
            )
        speaker = ctx.voice(body.audio.voice, "audio.voice")
        if call is not None:
            raise bad_request(
                "tool_choice: function calls are text; ask for modalities ['text'] or send "
                "tool_choice 'none'",
                "tool_choice",
                "unsupported_value",
            )
        if n > 1:
            raise bad_request(
                f"n: {n} choices are served for text replies only (without audio)",
                "n",
                "unsupported_value",
            )
    plans = sampling.choice_plans(
        ctx.async_omni,
        text_stage,
        body,
        n,
        max_tokens=body.max_completion_tokens or body.max_tokens,
        default_max_tokens=ctx.args.max_tokens,
        logprobs=(body.top_logprobs or 0) if body.logprobs else None,
        text_final=not want_audio,
        json_schema=json_schema if call is None else call.json_schema or json_schema,
    )
    prompt = await asyncio.to_thread(
        chat_prompt,
        ctx.async_omni.prompt_processor,
        body.messages,
        ctx.args,
        None if call is None else call.tools,
    )
    if body.cache_salt is not None:
        prompt["cache_salt"] = body.cache_salt
    if speaker is not None:
        prompt["speaker"] = speaker
    request_id = new_id("chatcmpl")
    prepared = await streaming.prepare(ctx.async_omni, prompt, request_id)
    limit_param = "max_completion_tokens" if body.max_completion_tokens else "max_tokens"
    sampling.check_context(
        ctx.async_omni,
        text_stage,
        prepared,
        body.max_completion_tokens or body.max_tokens,
        limit_param,
    )
    final_stage = None if want_audio else text_stage
    timer = ctx.metrics.timer(ENDPOINT)
    choices = [
        ChatChoice(ctx, body, request_id, text_stage, plan, want_audio, j, call)
        for j, plan in enumerate(plans)
    ]
    for choice in choices[1:]:  # one completion: every chunk has the same `created`
        choice.created = choices[0].created
    # Streamed audio takes the streaming path; a non-streamed response keeps the exact one.
    runs = [
        ctx.async_omni.run(
            prepared if n == 1 else dataclasses.replace(prepared, request_id=f"{request_id}-{j}"),
            plan.params,
            final_stage=final_stage,
            step_snapshots=bool(body.stream),
            stream_audio=bool(body.stream) and want_audio,
        )
        for j, plan in enumerate(plans)
    ]
    if body.stream:
        events = chat_choice.stream(choices, runs, timer)
        return StreamingResponse(events, media_type="text/event-stream")
    try:
        outs = await streaming.until_disconnected(request, streaming.collect_all(runs, timer))
    except streaming.ClientGone:
        return Response(status_code=499)
    return JSONResponse(chat_choice.response(choices, outs))
