"""POST /v1/completions: one prompt (text or token ids) through the pipeline up to its last text
stage; the text stage's text back, whole or streamed (`text_completion` chunks). `echo` puts the
prompt ahead of it, and with `logprobs` the prompt tokens' logprobs ahead of the generated
ones' (a scoring request, as lm-evaluation-harness sends: not streamed)."""

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
from omni.entrypoints.openai.logprobs import LogprobCursor
from omni.entrypoints.openai.protocol import CompletionRequest
from omni.entrypoints.snapshot_cursor import SnapshotCursor

ENDPOINT = "/v1/completions"


def _prompt(body: CompletionRequest) -> dict[str, Any]:
    prompt: Any = body.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
        if len(prompt) != 1:
            raise bad_request(
                f"prompt: one prompt per request is supported, got {len(prompt)}",
                "prompt",
                "unsupported_value",
            )
        prompt = prompt[0]
    if isinstance(prompt, str):
        if not prompt:
            raise bad_request("prompt: must be a non-empty string, got ''", "prompt")
        out: dict[str, Any] = {"prompt": prompt}
    else:
        if not prompt:
            raise bad_request("prompt: the token id list is empty", "prompt")
        out = {"prompt_token_ids": list(prompt)}
    if body.cache_salt is not None:
        out["cache_salt"] = body.cache_salt
    return out


def _echo(ctx: Context, body: CompletionRequest, prompt_ids: list[int], text_stage: str) -> str:
    """The prompt as `echo` returns it: the text as sent, or token ids' text."""
    prompt = body.prompt[0] if isinstance(body.prompt, list) and body.prompt else body.prompt
    if isinstance(prompt, str):
        return prompt
    return "".join(text for text, _ in ctx.async_omni.token_texts(text_stage, prompt_ids))


async def create(ctx: Context, request: Request, body: CompletionRequest) -> Response:
    ctx.check_model(body.model)
    for name, value, ok in (
        ("n", body.n, body.n in (None, 1)),
        ("suffix", body.suffix, body.suffix is None),
    ):
        if not ok:
            raise bad_request(f"{name}: {value!r} is not supported", name, "unsupported_value")
    text_stage = ctx.text_stage()
    scored = bool(body.echo) and body.logprobs is not None  # the prompt's logprobs too
    if scored and (body.stream or ctx.async_omni.config.stage(text_stage).inputs):
        why = (
            "streamed" if body.stream else f"when the text stage ({text_stage!r}) is not the first"
        )
        raise bad_request(
            f"echo: the prompt's logprobs (echo with logprobs) are not served {why}",
            "echo",
            "unsupported_value",
        )
    plan = sampling.plan(
        ctx.async_omni,
        text_stage,
        max_tokens=body.max_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        top_k=body.top_k,
        presence_penalty=body.presence_penalty,
        frequency_penalty=body.frequency_penalty,
        logit_bias=body.logit_bias,
        seed=body.seed,
        stop=body.stop,
        stage_sampling=body.stage_sampling,
        logprobs=body.logprobs,
        prompt_logprobs=body.logprobs if scored else None,
        text_final=True,
    )
    request_id = new_id("cmpl")
    prepared = await streaming.prepare(ctx.async_omni, _prompt(body), request_id)
    sampling.check_context(ctx.async_omni, text_stage, prepared, body.max_tokens, "max_tokens")
    cursor = SnapshotCursor(text_stage, plan.stop_strings)
    echoed = _echo(ctx, body, prepared.prompt_token_ids, text_stage) if body.echo else ""
    logprobs = LogprobCursor(ctx.async_omni, text_stage, chat=False, text_offset=len(echoed))
    timer = ctx.metrics.timer(ENDPOINT)
    created = int(time.time())
    outputs = ctx.async_omni.run(
        prepared, plan.params, final_stage=text_stage, step_snapshots=bool(body.stream)
    )

    def chunk(text: str, finish: str | None, out: Any = None, **extra: Any) -> dict[str, Any]:
        """A choice of `text`, with the logprobs of the tokens new in `out` (when given)."""
        new_logprobs = None if out is None else logprobs.new(out)
        choices = [{"index": 0, "text": text, "finish_reason": finish, "logprobs": new_logprobs}]
        return {
            "id": request_id,
            "object": "text_completion",
            "created": created,
            "model": ctx.args.model_name,
            "choices": choices if text is not None else [],
            **extra,
        }

    async def events() -> AsyncIterator[bytes]:
        last, ok = None, False
        try:
            if echoed:
                yield streaming.sse(chunk(echoed, None))
            async with contextlib.aclosing(outputs) as snapshots:
                async for last in snapshots:
                    timer.output()
                    delta = cursor.advance(last).text
                    if delta:
                        timer.first_token()
                        yield streaming.sse(chunk(delta, None, last))
            try:
                out = streaming.check(last)
            except Exception as e:  # noqa: BLE001 - reported in the stream, the status is sent
                yield streaming.sse(from_exception(e).body())
                yield streaming.DONE
                return
            ok = True
            # With the finish: tokens that added no text (e.g. part of a character).
            yield streaming.sse(chunk("", streaming.finish_reason(out, text_stage), out))
            if body.stream_options is not None and body.stream_options.include_usage:
                usage = streaming.usage(ctx.async_omni, out, text_stage)
                yield streaming.sse({**chunk("", None), "choices": [], "usage": usage})
            yield streaming.DONE
        finally:
            timer.done(ok=ok)

    if body.stream:
        return StreamingResponse(events(), media_type="text/event-stream")

    try:
        out = await streaming.until_disconnected(request, streaming.collect(outputs, timer))
    except streaming.ClientGone:
        return Response(status_code=499)
    response = chunk(echoed + cursor.text(out), streaming.finish_reason(out, text_stage), out)
    if scored:
        choice = response["choices"][0]
        choice["logprobs"] = logprobs.echoed(out, choice["logprobs"])
    response["usage"] = streaming.usage(ctx.async_omni, out, text_stage)
    return JSONResponse(response)
