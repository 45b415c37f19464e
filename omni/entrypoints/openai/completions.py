"""POST /v1/completions: prompts (text or token ids, one or a list) through the pipeline up to its
last text stage; the text stage's text back, whole or streamed (`text_completion` chunks). Each
prompt gets `n` choices (index = prompt * n + sample; sample j of a request with a `seed` draws
with seed + j, so that the samples differ and each is reproducible); every choice runs as its own
request, and the prefix cache serves the shared prompt. `echo` puts the prompt ahead of the
text, and with `logprobs` the prompt tokens' logprobs ahead of the generated ones' (a scoring
request, as lm-evaluation-harness sends: not streamed)."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.requests import Request

from omni.entrypoints.openai import sampling, streaming, structured_outputs
from omni.entrypoints.openai.context import Context, new_id
from omni.entrypoints.openai.errors import bad_request
from omni.entrypoints.openai.logprobs import LogprobCursor
from omni.entrypoints.openai.protocol import CompletionRequest
from omni.entrypoints.snapshot_cursor import SnapshotCursor
from omni.messages import OmniOutput

ENDPOINT = "/v1/completions"
MAX_CHOICES = streaming.MAX_CHOICES


@dataclasses.dataclass
class _Choice:
    index: int
    counts_prompt: bool  # its prompt's first sample: the prompt's tokens count in the usage
    echoed: str
    cursor: SnapshotCursor
    logprobs: LogprobCursor
    outputs: Any  # AsyncOmni.run's snapshots
    last: OmniOutput | None = None


def _prompts(body: CompletionRequest) -> list[dict[str, Any]]:
    """Each prompt as AsyncOmni takes it (a list of strings or of token-id lists is several)."""
    prompt: Any = body.prompt
    several = isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list)
    out = []
    for i, one in enumerate(prompt if several else [prompt]):
        where = f"prompt[{i}]" if several else "prompt"
        if isinstance(one, str):
            if not one:
                raise bad_request(f"{where}: must be a non-empty string, got ''", where)
            item: dict[str, Any] = {"prompt": one}
        else:
            if not one:
                raise bad_request(f"{where}: the token id list is empty", where)
            item = {"prompt_token_ids": list(one)}
        if body.cache_salt is not None:
            item["cache_salt"] = body.cache_salt
        out.append(item)
    return out


def _echo(ctx: Context, prompt: dict[str, Any], prompt_ids: list[int], text_stage: str) -> str:
    """The prompt as `echo` returns it: the text as sent, or token ids' text."""
    if "prompt" in prompt:
        return str(prompt["prompt"])
    return "".join(text for text, _ in ctx.async_omni.token_texts(text_stage, prompt_ids))


async def create(ctx: Context, request: Request, body: CompletionRequest) -> Response:
    ctx.check_model(body.model)
    if body.suffix is not None:
        raise bad_request(
            f"suffix: {body.suffix!r} is not supported", "suffix", "unsupported_value"
        )
    prompts, n = _prompts(body), 1 if body.n is None else body.n
    if n < 1 or len(prompts) * n > MAX_CHOICES:
        raise bad_request(
            f"n: {n} choices for each of {len(prompts)} prompt(s) is outside [1, {MAX_CHOICES}] "
            "choices in all",
            "n",
        )
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
    plans = sampling.choice_plans(
        ctx.async_omni,
        text_stage,
        body,
        n,
        max_tokens=body.max_tokens,
        default_max_tokens=ctx.args.max_tokens,
        logprobs=body.logprobs,
        prompt_logprobs=body.logprobs if scored else None,
        text_final=True,
        json_schema=structured_outputs.requested(body),
    )
    request_id = new_id("cmpl")
    choices: list[_Choice] = []
    for i, prompt in enumerate(prompts):
        param = "max_tokens" if len(prompts) == 1 else f"max_tokens (prompt[{i}])"
        prepared = await streaming.prepare(ctx.async_omni, prompt, f"{request_id}-{i}")
        sampling.check_context(ctx.async_omni, text_stage, prepared, body.max_tokens, param)
        echoed = _echo(ctx, prompt, prepared.prompt_token_ids, text_stage) if body.echo else ""
        for j, plan in enumerate(plans):
            one = dataclasses.replace(prepared, request_id=f"{request_id}-{i}-{j}")
            outputs = ctx.async_omni.run(
                one, plan.params, final_stage=text_stage, step_snapshots=bool(body.stream)
            )
            cursor = SnapshotCursor(text_stage, plan.stop_strings)
            logprobs = LogprobCursor(ctx.async_omni, text_stage, False, text_offset=len(echoed))
            choices.append(_Choice(len(choices), j == 0, echoed, cursor, logprobs, outputs))
    timer = ctx.metrics.timer(ENDPOINT)
    created = int(time.time())

    def chunk(choice: _Choice | None, text: str, finish: str | None, **extra: Any) -> dict:
        """`text` of a choice (with the logprobs of the tokens new in its last snapshot)."""
        items = []
        if choice is not None:
            new_logprobs = None if choice.last is None else choice.logprobs.new(choice.last)
            items = [{"index": choice.index, "text": text, "finish_reason": finish,
                      "logprobs": new_logprobs}]  # fmt: skip
        return {"id": request_id, "object": "text_completion", "created": created,
                "model": ctx.args.model_name, "choices": items, **extra}  # fmt: skip

    def usage(outs: list[OmniOutput]) -> dict[str, Any]:
        each = [streaming.usage(ctx.async_omni, out, text_stage) for out in outs]
        return streaming.total_usage(each, [c.counts_prompt for c in choices])

    async def events() -> AsyncIterator[bytes]:
        ok = False
        try:
            for choice in choices:
                if choice.echoed:
                    yield streaming.sse(chunk(choice, choice.echoed, None))
            merged = streaming.merged([c.outputs for c in choices])
            async with contextlib.aclosing(merged) as snapshots:
                async for index, out in snapshots:
                    timer.output()
                    choice = choices[index]
                    choice.last = out
                    delta = choice.cursor.advance(out).text
                    if delta:
                        timer.first_token()
                        yield streaming.sse(chunk(choice, delta, None))
            outs, failure = streaming.checked_or_error([c.last for c in choices])
            if failure:
                for piece in failure:
                    yield piece
                return
            ok = True
            for choice, out in zip(choices, outs, strict=True):
                # With the finish: tokens that added no text (e.g. part of a character).
                yield streaming.sse(chunk(choice, "", streaming.finish_reason(out, text_stage)))
            if body.stream_options is not None and body.stream_options.include_usage:
                yield streaming.sse(chunk(None, "", None, usage=usage(outs)))
            yield streaming.DONE
        finally:
            timer.done(ok=ok)

    if body.stream:
        return StreamingResponse(events(), media_type="text/event-stream")

    runs = [c.outputs for c in choices]
    try:
        outs = await streaming.until_disconnected(request, streaming.collect_all(runs, timer))
    except streaming.ClientGone:
        return Response(status_code=499)
    items = []
    for choice, out in zip(choices, outs, strict=True):
        choice.last = out
        text = choice.echoed + choice.cursor.text(out)
        item = chunk(choice, text, streaming.finish_reason(out, text_stage))["choices"][0]
        if scored:
            item["logprobs"] = choice.logprobs.echoed(out, item["logprobs"])
        items.append(item)
    response = {**chunk(None, "", None), "choices": items, "usage": usage(outs)}
    return JSONResponse(response)
