"""`GET /v1/realtime?model=NAME`: the WebSocket upgrade. The server's API key is checked as the
`Authorization: Bearer` header and the model name against the served one before the upgrade is
accepted; a refused upgrade is an HTTP error response in OpenAI's shape (401, 400, 404), where
the ASGI server supports WebSocket denial responses (uvicorn does), else a close with 1008."""

from __future__ import annotations

from starlette.websockets import WebSocket

from omni.entrypoints.openai.context import Context, check_api_key
from omni.entrypoints.openai.errors import OpenAIError, bad_request
from omni.entrypoints.openai.realtime.connection import Connection
from omni.entrypoints.openai.realtime.events import MAX_EVENT_BYTES


async def serve(ws: WebSocket, ctx: Context, max_event_bytes: int = MAX_EVENT_BYTES) -> None:
    """Accept (or refuse) the upgrade and run the connection until it closes."""
    try:
        check_api_key(ws, ctx.args)
        model = ws.query_params.get("model")
        if model is None:
            raise bad_request(
                "Missing required parameter: 'model' (/v1/realtime?model=NAME)",
                "model",
                "missing_required_parameter",
            )
        ctx.check_model(model)
    except OpenAIError as e:
        if "websocket.http.response" in ws.scope.get("extensions", {}):
            await ws.send_denial_response(e.response())
        else:
            await ws.close(code=1008, reason=e.message[:120])
        return
    await ws.accept()
    await Connection(ws, ctx, max_event_bytes).serve()
