"""`omni serve`: an OpenAI-compatible HTTP server on top of AsyncOmni.

    build_app(async_omni, ServerArgs(...))  -> a FastAPI app (tests and embedding)
    run_server(async_omni, ServerArgs(...)) -> serves an AsyncOmni until SIGINT/SIGTERM

Modules by concern: `protocol` (request models), `errors` (every exception -> OpenAI's error
body), `prompts` (chat messages -> a prompt, under the server's media policy; the conversion
itself, shared with Omni.chat, is omni/entrypoints/chat_messages.py and media_parts.py), `sampling` (request fields -> per-stage
SamplingParams), `chat`, `completions`, `speech` (the endpoints), `streaming` (SSE and
disconnect handling), `audio_encoding` (wav/pcm16 bytes), `metrics` (Prometheus), `app`
(routes, auth, body limit), `server` (uvicorn, signals, the ready line), `realtime/` (the
`/v1/realtime` WebSocket: OpenAI Realtime sessions, docs/serving.md).
"""

from __future__ import annotations

from omni.entrypoints.openai.args import ServerArgs

__all__ = ["ServerArgs"]
