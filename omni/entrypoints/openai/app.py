"""build_app(async_omni, args): the FastAPI app. Routes (and the /v1/realtime WebSocket,
realtime/), bearer-key auth on /v1, the body size limit, strict JSON parsing into the protocol
models, and every error in OpenAI's shape."""

from __future__ import annotations

from typing import Any, TypeVar

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from starlette.websockets import WebSocket

from omni.entrypoints.openai import (
    chat,
    completions,
    responses,
    speech,
    tokenize,
    transcription,
)
from omni.entrypoints.openai.args import ServerArgs
from omni.entrypoints.openai.context import Context
from omni.entrypoints.openai.context import check_api_key as _auth
from omni.entrypoints.openai.errors import (
    OpenAIError,
    bad_request,
    from_exception,
    from_validation_error,
)
from omni.entrypoints.openai.metrics import ENDPOINTS, ServerMetrics
from omni.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    ResponsesRequest,
    SpeechRequest,
    TokenizeRequest,
)
from omni.entrypoints.openai.realtime import endpoint as realtime

M = TypeVar("M", bound=BaseModel)


def build_app(async_omni: Any, args: ServerArgs) -> FastAPI:
    app = FastAPI(title="omni", docs_url=None, redoc_url=None, openapi_url=None)
    ctx = Context(async_omni, args, ServerMetrics(async_omni))
    app.state.omni = ctx

    @app.exception_handler(OpenAIError)
    async def _openai_error(request: Request, exc: OpenAIError) -> Response:
        return exc.response()

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        return OpenAIError(exc.status_code, str(exc.detail), code="not_found").response()

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> Response:
        return from_validation_error(list(exc.errors())).response()

    @app.exception_handler(Exception)
    async def _any_error(request: Request, exc: Exception) -> Response:
        return from_exception(exc).response()

    @app.get("/health")
    async def health() -> Response:
        try:
            down = await async_omni.check_health()
        except RuntimeError as e:
            return OpenAIError(503, f"unhealthy: {e}", code="stage_unavailable").response()
        # 200 while every stage has a replica serving; the others are named.
        return JSONResponse({"status": "ok", **({"replicas_down": down} if down else {})})

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(await ctx.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        _auth(request, args)
        return JSONResponse({"object": "list", "data": [_model_card(ctx)]})

    @app.get("/v1/models/{model:path}")
    async def model(request: Request, model: str) -> Response:
        _auth(request, args)
        ctx.check_model(model)
        return JSONResponse(_model_card(ctx))

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        _auth(request, args)
        return await chat.create(ctx, request, await _parse(request, ChatCompletionRequest, args))

    @app.post("/v1/completions")
    async def text_completions(request: Request) -> Response:
        _auth(request, args)
        return await completions.create(
            ctx, request, await _parse(request, CompletionRequest, args)
        )

    @app.post("/tokenize")
    async def tokenize_prompt(request: Request) -> Response:
        _auth(request, args)
        body = await _parse(request, TokenizeRequest, args)
        return JSONResponse(await tokenize.tokenize(ctx, body))

    @app.post("/detokenize")
    async def detokenize_ids(request: Request) -> Response:
        _auth(request, args)
        body = await _parse(request, DetokenizeRequest, args)
        return JSONResponse(await tokenize.detokenize(ctx, body))

    @app.post(responses.ENDPOINT)
    async def responses_create(request: Request) -> Response:
        _auth(request, args)
        return await responses.create(ctx, request, await _parse(request, ResponsesRequest, args))

    @app.post("/v1/audio/speech")
    async def audio_speech(request: Request) -> Response:
        _auth(request, args)
        return await speech.create(ctx, request, await _parse(request, SpeechRequest, args))

    @app.post(transcription.TRANSCRIBE)
    async def audio_transcriptions(request: Request) -> Response:
        _auth(request, args)
        body = await _body(request, args)
        return await transcription.create(ctx, request, body, transcription.TRANSCRIBE)

    @app.post(transcription.TRANSLATE)
    async def audio_translations(request: Request) -> Response:
        _auth(request, args)
        body = await _body(request, args)
        return await transcription.create(ctx, request, body, transcription.TRANSLATE)

    @app.websocket("/v1/realtime")
    async def realtime_session(ws: WebSocket) -> None:
        await realtime.serve(ws, ctx)

    app.add_middleware(_CountRequests, metrics=ctx.metrics)
    return app


def _model_card(ctx: Context) -> dict[str, Any]:
    return {
        "id": ctx.args.model_name,
        "object": "model",
        "created": ctx.created,
        "owned_by": "omni",
    }


async def _body(request: Request, args: ServerArgs) -> bytes:
    """The request's body: 413 over the size limit, 400 when empty."""
    limit = args.max_body_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(int(declared), limit)
    body = bytearray()
    async for piece in request.stream():
        body += piece
        if len(body) > limit:
            raise _too_large(len(body), limit)
    if not body:
        raise bad_request("the request body is empty", None)
    return bytes(body)


async def _parse(request: Request, model: type[M], args: ServerArgs) -> M:
    """The JSON body as `model`: 413 over the size limit, 400 for bad JSON or a bad field."""
    body = await _body(request, args)
    try:
        return model.model_validate_json(body)
    except ValidationError as e:
        errors = e.errors()
        if errors and errors[0].get("type") == "json_invalid":
            raise bad_request(
                f"the request body is not valid JSON: {errors[0].get('msg')}", None, "invalid_json"
            ) from None
        raise from_validation_error(list(errors)) from None


def _too_large(size: int, limit: int) -> OpenAIError:
    return OpenAIError(
        413,
        f"the request body ({size} bytes or more) is over the limit of {limit} bytes",
        code="request_too_large",
    )


class _CountRequests:
    """Pure ASGI (streaming and disconnects pass through untouched): counts each request by
    endpoint, and each error status."""

    def __init__(self, app: ASGIApp, metrics: ServerMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or path not in ENDPOINTS:
            await self.app(scope, receive, send)
            return
        status = 500

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            self.metrics.requests.labels(path).inc()
            if status >= 400:
                self.metrics.errors.labels(path, str(status)).inc()
