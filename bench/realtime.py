"""`/v1/realtime` latency: from the end of the user's speech to the first audio of the reply, at
1 and 8 concurrent connections, beside the same request over HTTP streaming.

A real `omni serve` subprocess (local backend). Each request is one spoken turn (a synthetic
vowel-like signal Silero VAD takes for speech, 1 s, then 0.6 s of silence; a different pitch per
request, so that no request is served from the prefix cache of another) answered with audio, on a
fresh connection (connecting is not timed), by C closed-loop clients, N requests per level:

- realtime, commit: VAD off; the audio is appended, then the clock starts and the client sends
  `input_audio_buffer.commit` and `response.create`; stops at the first
  `response.output_audio.delta`.
- realtime, VAD: server VAD (silence_duration_ms as given); the audio (speech + silence) is
  appended at once; the clock starts when `input_audio_buffer.speech_stopped` arrives (the server
  committed and started the response then); stops at the first audio delta. A user waits
  silence_duration_ms longer than this: the silence that ends the turn.
- HTTP: `/v1/chat/completions` with the same audio as an `input_audio` WAV, `stream: true`,
  `modalities: ["text", "audio"]` (pcm16): the clock starts when the request is sent (it carries
  the audio) and stops at the first `delta.audio` piece.

All three run the same prompt through the same streaming path with the stage configs' sampling
and the same max tokens. Timings only (random weights); one run on a shared machine.

    .venv/bin/python bench/realtime.py [--size tiny] [--requests 16] [--thinker-tokens 16]
        [--concurrency 1 8] [--silence-ms 500] [--threads 2]
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "tests" / "integration"))
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import argparse  # noqa: E402
import asyncio  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402

import httpx  # noqa: E402
import numpy as np  # noqa: E402
import openai  # noqa: E402
from bench_table import table  # noqa: E402
from realtime_support import NO_VAD, append, silence, speech, wav_part  # noqa: E402

from tools.make_tiny_checkpoint import ensure_checkpoint  # noqa: E402
from tools.serve_process import ServeProcess  # noqa: E402

MODEL = "tiny-omni"
VOICE = "Chelsie"
MODES = ("realtime, commit", "realtime, VAD", "HTTP stream")


def utterance(i: int) -> np.ndarray:
    return speech(1.0, f0=110.0 + (i % 50) * 2.0)


async def _first_audio(conn, start: float | None) -> float:
    """Reads events until the first audio delta; the time since `start` (or since the
    speech_stopped event, when start is None); then waits for response.done."""
    first = None
    while True:
        event = await conn.recv()
        if event.type == "error":
            raise RuntimeError(event.error.message)
        if event.type == "input_audio_buffer.speech_stopped" and start is None:
            start = time.perf_counter()
        if event.type == "response.output_audio.delta" and first is None:
            assert start is not None
            first = time.perf_counter() - start
        if event.type == "response.done":
            assert first is not None, event.response.status
            return first


async def realtime_turn(base_url: str, i: int, args, vad: bool) -> float:
    client = openai.AsyncOpenAI(base_url=base_url + "/v1", api_key="-", max_retries=0)
    turn_detection = {"type": "server_vad", "silence_duration_ms": args.silence_ms} if vad else None
    session = {**NO_VAD, "max_output_tokens": args.thinker_tokens}
    session["audio"] = {"input": {"turn_detection": turn_detection}, "output": {"voice": VOICE}}
    async with client.realtime.connect(model=MODEL) as conn:
        await conn.session.update(session=session)
        while (await conn.recv()).type != "session.updated":
            pass
        audio = utterance(i)
        if vad:
            await append(conn, np.concatenate([silence(0.3), audio, silence(0.6)]))
            return await _first_audio(conn, None)
        await append(conn, audio)
        start = time.perf_counter()
        await conn.input_audio_buffer.commit()
        await conn.response.create()
        return await _first_audio(conn, start)


async def http_turn(http: httpx.AsyncClient, i: int, args) -> float:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": [wav_part(utterance(i))]}],
        "max_tokens": args.thinker_tokens,
        "modalities": ["text", "audio"],
        "audio": {"voice": VOICE, "format": "pcm16"},
        "stream": True,
    }
    start = time.perf_counter()
    first = None
    async with http.stream("POST", "/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(chunk["error"])
            for choice in chunk["choices"]:
                if (choice["delta"].get("audio") or {}).get("data") and first is None:
                    first = time.perf_counter() - start
    assert first is not None
    return first


async def run_clients(base_url: str, mode: str, concurrency: int, ids: list[int], args):
    queue = list(ids)
    results: list[float] = []
    async with httpx.AsyncClient(base_url=base_url, timeout=600) as http:

        async def client() -> None:
            while queue:
                i = queue.pop(0)
                if mode == "HTTP stream":
                    results.append(await http_turn(http, i, args))
                else:
                    results.append(await realtime_turn(base_url, i, args, "VAD" in mode))

        await asyncio.gather(*(client() for _ in range(concurrency)))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="tiny", choices=["tiny", "bench"])
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--thinker-tokens", type=int, default=16)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--silence-ms", type=int, default=500)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    model_dir = str(ensure_checkpoint("qwen2_5_omni", args.size))
    n = args.requests
    server_args = ["--model", model_dir, "--served-model-name", MODEL]
    server_args += ["--set", "runtime.backend=local"]
    rows = []
    with ServeProcess(server_args, threads=args.threads) as server:
        for mode in MODES:  # warm-up: every path once
            asyncio.run(run_clients(server.base_url, mode, 2, [100_000, 100_001], args))
        for level, c in enumerate(args.concurrency):
            for m, mode in enumerate(MODES):
                # Distinct audio per request: nothing comes from the prefix cache of another.
                ids = list(range((level * len(MODES) + m) * n, (level * len(MODES) + m + 1) * n))
                values = asyncio.run(run_clients(server.base_url, mode, c, ids, args))
                p50, p99 = (float(np.percentile(values, q)) * 1000 for q in (50, 99))
                rows.append([str(c), mode, f"{p50:.0f} ms", f"{p99:.0f} ms"])
                print(f"{c} clients, {mode}: p50 {p50:.0f} ms, p99 {p99:.0f} ms", flush=True)
    print(
        f"\n## end of speech -> first audio delta: {n} spoken turns per row, audio out, thinker "
        f"<= {args.thinker_tokens} tokens, {args.size} Qwen2.5-Omni, {args.threads} torch "
        f"threads, VAD silence {args.silence_ms} ms (not included)"
    )
    table(["clients", "path", "first audio p50", "first audio p99"], rows)


if __name__ == "__main__":
    main()
