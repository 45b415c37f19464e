"""Server events of OpenAI's Realtime API (GA names): the envelope every event has, `error` in
OpenAI's shape, and ids in OpenAI's style (`event_...`, `item_...`, `resp_...`, `sess_...`)."""

from __future__ import annotations

import uuid
from typing import Any

from omni.entrypoints.openai.errors import OpenAIError


def make_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def event(kind: str, **fields: Any) -> dict[str, Any]:
    """A server event of type `kind` with a fresh event_id."""
    return {"type": kind, "event_id": make_id("event"), **fields}


def error(err: OpenAIError, client_event_id: str | None) -> dict[str, Any]:
    """The `error` event: OpenAI's error object, naming the client event it answers."""
    body = err.body()["error"]
    return event("error", error={**body, "event_id": client_event_id})
