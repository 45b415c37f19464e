"""Prometheus metrics of one server (its own registry, so two apps in a process never mix).

Counters: requests and errors by endpoint. Gauges: requests running in the pipeline (read at
scrape), requests the server holds that have no output yet (waiting), and per stage the engine's
prefix-cache queried/hit tokens, output-cache hit rows, requests and KV blocks in use (refreshed
from `async_omni.stats()` at every scrape). Histograms: time to first token (streamed requests:
the first text token), time to first audio, end-to-end latency, by endpoint.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

ENDPOINTS = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/responses",
    "/v1/audio/speech",
    "/v1/audio/transcriptions",
    "/v1/audio/translations",
    "/v1/models",
)
_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
_STAGE_GAUGES = {
    "kv_queried_tokens": "prefix-cache lookups: prompt tokens queried (total)",
    "kv_hit_tokens": "prefix-cache lookups: prompt tokens hit (total)",
    "output_hit_rows": "stage-output cache: rows served from the cache (total)",
    "num_requests": "requests in the stage now",
    "kv_blocks_in_use": "KV cache blocks in use now",
    "chunks": "vocoder: audio chunks decoded (total)",
    "chunks_per_request": "vocoder: chunks per streamed request",
    "audio_s": "vocoder: seconds of audio produced (total)",
    "rtf": "vocoder: compute seconds per second of audio",
    "first_audio_s_p50": "vocoder: arrival in the stage to first audio, p50 of recent requests",
    "first_audio_s_p99": "vocoder: arrival in the stage to first audio, p99 of recent requests",
}


class ServerMetrics:
    def __init__(self, async_omni: Any) -> None:
        self.async_omni = async_omni
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "omni_requests", "HTTP requests by endpoint", ["endpoint"], registry=r
        )
        self.errors = Counter(
            "omni_request_errors",
            "error responses by endpoint and status",
            ["endpoint", "status"],
            registry=r,
        )
        self.running = Gauge("omni_requests_running", "requests running in the engine", registry=r)
        self.running.set_function(self._num_running)
        self.waiting = Gauge(
            "omni_requests_waiting", "requests accepted that have no output yet", registry=r
        )
        self.ttft = Histogram(
            "omni_time_to_first_token_seconds",
            "time to the first text token (streamed)",
            ["endpoint"],
            buckets=_BUCKETS,
            registry=r,
        )
        self.ttfa = Histogram(
            "omni_time_to_first_audio_seconds",
            "time to the first audio",
            ["endpoint"],
            buckets=_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "omni_e2e_request_latency_seconds",
            "request start to last output",
            ["endpoint"],
            buckets=_BUCKETS,
            registry=r,
        )
        self.stage = {
            key: Gauge(f"omni_stage_{key}", help_, ["stage"], registry=r)
            for key, help_ in _STAGE_GAUGES.items()
        }

    def _num_running(self) -> float:
        try:
            return float(self.async_omni.num_requests)
        except RuntimeError:  # shut down
            return 0.0

    def timer(self, endpoint: str) -> RequestTimer:
        return RequestTimer(self, endpoint)

    async def render(self) -> bytes:
        try:
            stats = await asyncio.to_thread(self.async_omni.stats)
        except RuntimeError:
            stats = {}
        for stage, values in stats.items():
            for key, gauge in self.stage.items():
                value = values.get(key)
                if isinstance(value, int | float):
                    gauge.labels(stage).set(value)
        return generate_latest(self.registry)


class RequestTimer:
    """One request's timings; counts it as waiting until its first output."""

    def __init__(self, metrics: ServerMetrics, endpoint: str) -> None:
        self.metrics = metrics
        self.endpoint = endpoint
        self.start = time.perf_counter()
        self._waiting = True
        self._token = self._audio = False
        metrics.waiting.inc()

    def output(self) -> None:
        if self._waiting:
            self._waiting = False
            self.metrics.waiting.dec()

    def first_token(self) -> None:
        self.output()
        if not self._token:
            self._token = True
            self.metrics.ttft.labels(self.endpoint).observe(time.perf_counter() - self.start)

    def first_audio(self) -> None:
        self.output()
        if not self._audio:
            self._audio = True
            self.metrics.ttfa.labels(self.endpoint).observe(time.perf_counter() - self.start)

    def done(self, ok: bool = True) -> None:
        self.output()
        if ok:
            self.metrics.e2e.labels(self.endpoint).observe(time.perf_counter() - self.start)
