"""The server's /health on a stage that dies, in-process (FastAPI's TestClient, local backend):
503 naming the stage, while a request that needed it fails with 503 instead of hanging."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from two_stage_support import two_stage_config

from omni import AsyncOmni
from omni.entrypoints.openai.app import build_app
from omni.entrypoints.openai.args import ServerArgs

pytestmark = pytest.mark.slow


class _LoopKiller(BaseException):
    """Not an Exception: escapes the per-step recovery and ends the stage's loop thread."""


def test_health_names_a_dead_stage(qwen2_dir, llama_dir):
    engine = AsyncOmni(two_stage_config(qwen2_dir, llama_dir, **{"runtime.backend": "local"}))
    try:
        with TestClient(build_app(engine, ServerArgs(model_name="tiny"))) as client:
            assert client.get("/health").status_code == 200
            body = {"model": "tiny", "prompt": "hello", "max_tokens": 3}
            assert client.post("/v1/completions", json=body).status_code == 200

            def die():
                raise _LoopKiller("the stage's thread is gone")

            engine._driver().backend.hosts["b"].engine.step = die
            failed = client.post("/v1/completions", json=body)
            assert failed.status_code == 503, failed.text
            assert "stage 'b'" in failed.json()["error"]["message"]
            health = client.get("/health")
            assert health.status_code == 503
            assert "stage 'b': engine loop died" in health.json()["error"]["message"]
    finally:
        engine.shutdown()
