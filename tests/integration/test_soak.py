"""A 200-request soak through `omni serve` (the tiny Qwen2.5-Omni on the CPU, local backend,
32 concurrent openai clients): bench/soak.py's run (tools/soak.py) at a fiftieth of its length.
Every kind is sent and answered (bad requests with their 4xx), every answer equals its prompt's
reference, every disconnecting client left early, and the server ends with no request running
or waiting and no KV block in use in any stage. RSS is reported, not asserted: 200 requests are
still the allocator's warm-up (docs/soak.md)."""

from __future__ import annotations

import asyncio

import openai  # noqa: F401 - tools.soak needs it; conftest.py leaves this module out without it
import pytest
from helpers import OMNI_ON_CPU, OMNI_STAGES, cli_sets

from tools.make_tiny_checkpoint import ensure_checkpoint
from tools.serve_process import ServeProcess
from tools.soak import SERVER_ENV, SoakConfig, run_soak, server_args
from tools.soak_requests import KINDS, REFERENCE_KIND

pytestmark = pytest.mark.slow


def test_soak_200_requests_loses_nothing():
    model_dir = str(ensure_checkpoint("qwen2_5_omni", "tiny"))
    config = SoakConfig(num_requests=200, concurrency=32, num_prompts=6)
    args = server_args(model_dir, "local") + cli_sets(OMNI_ON_CPU)
    with ServeProcess(args, env=SERVER_ENV) as server:
        assert server.proc is not None
        report = asyncio.run(run_soak(server.base_url, server.proc.pid, config))
    assert report.num_references == 6 * len(set(REFERENCE_KIND.values()))
    assert sum(s.count for s in report.kinds.values()) == 200
    for kind in KINDS:
        stats = report.kinds[kind]
        assert stats.count > 0, kind
        assert (stats.errors, stats.diverged) == (0, 0), (kind, stats.examples)
    assert report.kinds["disconnect"].left_early > 0
    assert report.kinds["chat_audio_stream"].ttfas_s and report.kinds["speech"].ttfas_s
    end = report.end
    assert end is not None
    assert (end.running, end.waiting) == (0, 0)
    assert set(end.stages) == set(OMNI_STAGES)
    for stage in ("thinker", "talker"):
        assert end.stages[stage] == {"num_requests": 0, "kv_blocks_in_use": 0}, stage
    assert end.stages["token2wav"] == {"num_requests": 0}  # a vocoder: no KV cache
    assert [s.num_done for s in report.rss] == list(range(20, 201, 20))
