"""What every endpoint needs: the AsyncOmni, the server's settings and metrics, and the checks
that depend on them (model name, voices, audio)."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import HTTPConnection

from omni.entrypoints.openai.args import ServerArgs
from omni.entrypoints.openai.errors import OpenAIError, bad_request
from omni.entrypoints.openai.metrics import ServerMetrics
from omni.entrypoints.openai.protocol import VoiceId


@dataclass
class Context:
    async_omni: Any  # AsyncOmni (or anything with its interface)
    args: ServerArgs
    metrics: ServerMetrics
    created: int = field(default_factory=lambda: int(time.time()))

    def check_model(self, model: str) -> None:
        if model != self.args.model_name:
            raise OpenAIError(
                404,
                f"The model {model!r} does not exist; this server serves {self.args.model_name!r}",
                param="model",
                code="model_not_found",
            )

    def text_stage(self, param: str = "model") -> str:
        stage = self.async_omni.text_stage
        if stage is None:
            raise bad_request(f"{self.args.model_name!r} produces no text", param, "unsupported")
        return str(stage)

    def require_audio(self, param: str) -> None:
        if self.async_omni.audio_stage is None:
            raise bad_request(
                f"{self.args.model_name!r} does not produce audio (its pipeline has no vocoder "
                "stage)",
                param,
                "unsupported_value",
            )

    def sample_rate(self, result: Any) -> int:
        """The rate of a result's audio: its own, else its model family's (ModelFamily)."""
        rate = result.sample_rate or self.async_omni.sample_rate
        if not rate:
            raise OpenAIError(500, "the pipeline returned audio without a sample rate")
        return int(rate)

    def voice(self, voice: str | VoiceId | None, param: str) -> str | None:
        """The speaker for a prompt: None for the model's default voice; else the model's name
        of the voice, matched case-insensitively ("ethan" and "Ethan" are one voice, as in the
        Python API)."""
        voices = list(self.async_omni.voices)
        name = voice.id if isinstance(voice, VoiceId) else voice
        if name is None or (not voices and name):
            return None  # one-voice models: any name is that voice
        match = [v for v in voices if v.lower() == name.lower()]
        if not match:
            raise bad_request(f"{param}: unknown voice {name!r}; voices: {voices}", param)
        return match[0]


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def check_api_key(connection: HTTPConnection, args: ServerArgs) -> None:
    """With --api-key: a 401 unless the request (or WebSocket upgrade) has
    `Authorization: Bearer <key>`."""
    if args.api_key is None:
        return
    header = connection.headers.get("authorization", "")
    scheme, _, key = header.partition(" ")
    if scheme.lower() != "bearer" or key.strip() != args.api_key:
        raise OpenAIError(
            401,
            "Incorrect API key provided" if header else "Missing bearer key (Authorization header)",
            code="invalid_api_key",
        )
