"""`omni serve` under 1, 8 and 32 concurrent clients (tiny Qwen2.5-Omni, text + audio out) versus
transformers' `Qwen2_5OmniForConditionalGeneration.generate`, one request at a time.

Ours: a real `omni serve` subprocess (local backend, talker input path `unmasked` as
transformers' single-request generate), C closed-loop async clients each streaming
`/v1/chat/completions` with `modalities: ["text", "audio"]` (a new request as soon as its last one
ends), N requests in all. Per request: TTFT (first `delta.content`), time to first audio (first
`delta.audio` piece) and end-to-end, measured at the client.

transformers: each of the same N prompts through one full `generate` (thinker exactly
--thinker-tokens, greedy talker up to --talker-tokens stopping at the codec EOS ids, one DiT
pass), one at a time, as a user without a server would run them. Measured per request: time to
the thinker's first token (end of its prefill forward) and to the audio (`generate` returning:
it gives no audio before). For C clients the same measured durations are replayed through a FIFO
queue in front of that single sequential loop (C closed-loop clients), which is what C users
sharing it would see; requests/s is N over the replayed makespan.

Timings only; the checkpoint has random weights. Ratios are from one run on a shared machine.

    .venv/bin/python bench/serve.py [--requests 32] [--thinker-tokens 16] [--talker-tokens 48]
        [--concurrency 1 8 32] [--threads 2]
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import argparse  # noqa: E402
import asyncio  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402

import httpx  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from bench_table import table  # noqa: E402
from omni_bench_support import CODEC_EOS, SEED, SUBJECTS, load_hf  # noqa: E402

from omni.entrypoints.openai.prompts import chat_prompt  # noqa: E402
from tools.make_tiny_checkpoint import ensure_checkpoint  # noqa: E402
from tools.omni_preprocess import OmniPreprocessor  # noqa: E402
from tools.serve_process import ServeProcess  # noqa: E402

MODEL = "tiny-omni"


def messages(i: int) -> list[dict]:
    subject = SUBJECTS[i % len(SUBJECTS)]
    return [
        {
            "role": "user",
            "content": f"Request {i}: describe {subject} in a few words, then say why.",
        }
    ]


# ---- ours: the server ------------------------------------------------------------------------
async def one_request(http: httpx.AsyncClient, i: int, args) -> dict:
    body = {
        "model": MODEL,
        "messages": messages(i),
        "max_tokens": args.thinker_tokens,
        "modalities": ["text", "audio"],
        "audio": {"voice": "Chelsie", "format": "pcm16"},
        "stream": True,
        "stage_sampling": {
            "thinker": {"ignore_eos": True},
            "talker": {"max_tokens": args.talker_tokens, "stop_token_ids": list(CODEC_EOS)},
            "token2wav": {"seed": SEED},
        },
    }
    start = time.perf_counter()
    ttft = ttfa = None
    async with http.stream("POST", "/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(chunk["error"])
            for choice in chunk["choices"]:
                delta = choice["delta"]
                if delta.get("content") and ttft is None:
                    ttft = time.perf_counter() - start
                if (delta.get("audio") or {}).get("data") and ttfa is None:
                    ttfa = time.perf_counter() - start
    return {"ttft": ttft, "ttfa": ttfa, "e2e": time.perf_counter() - start}


async def run_clients(base_url: str, concurrency: int, n: int, args, offset: int) -> dict:
    queue = list(range(offset, offset + n))
    results: list[dict] = []
    limits = httpx.Limits(max_connections=concurrency + 4)

    async with httpx.AsyncClient(base_url=base_url, timeout=600, limits=limits) as http:

        async def client() -> None:
            while queue:
                results.append(await one_request(http, queue.pop(0), args))

        start = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        wall = time.perf_counter() - start
    return {"wall": wall, "n": n, "results": results}


# ---- transformers: one generate at a time -----------------------------------------------------
def hf_timings(model, pre, text: str, args) -> tuple[float, float]:
    """(time to the thinker's first token, time to the audio) of one full generate."""
    marks: dict[str, float] = {}

    def first_forward(*_: object) -> None:
        marks.setdefault("first", time.perf_counter())

    kwargs = pre.generate_kwargs(pre(text))
    kwargs.pop("attention_mask", None)
    hook = model.thinker.register_forward_hook(first_forward)
    try:
        torch.manual_seed(SEED)
        start = time.perf_counter()
        with torch.inference_mode():
            model.generate(
                **kwargs,
                thinker_max_new_tokens=args.thinker_tokens,
                talker_max_new_tokens=args.talker_tokens,
                talker_do_sample=False,
            )
        end = time.perf_counter()
    finally:
        hook.remove()
    return marks["first"] - start, end - start


def replay(durations: list[tuple[float, float]], concurrency: int) -> dict:
    """C closed-loop clients in front of one sequential generate loop (FIFO)."""
    free_at = 0.0
    clients = [0.0] * concurrency  # when each client submits its next request
    results = []
    for ttft, e2e in durations:
        c = min(range(concurrency), key=lambda k: clients[k])
        submit = clients[c]
        begin = max(submit, free_at)
        free_at = begin + e2e
        clients[c] = free_at
        wait = begin - submit
        results.append({"ttft": wait + ttft, "ttfa": wait + e2e, "e2e": wait + e2e})
    return {"wall": free_at, "n": len(durations), "results": results}


# ---- report --------------------------------------------------------------------------------
def pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


def summary(run: dict) -> dict[str, float]:
    rs = run["results"]
    out = {"rps": run["n"] / run["wall"]}
    for key in ("ttft", "ttfa", "e2e"):
        values = [r[key] for r in rs if r[key] is not None]
        out[f"{key}_p50"] = pct(values, 50)
        out[f"{key}_p99"] = pct(values, 99)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="tiny", choices=["tiny", "bench"])
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--thinker-tokens", type=int, default=16)
    parser.add_argument("--talker-tokens", type=int, default=48)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model_dir = str(ensure_checkpoint("qwen2_5_omni", args.size))
    n = args.requests

    server_args = [
        "--model", model_dir, "--served-model-name", MODEL,
        "--set", "runtime.backend=local",
        "--set", "stages.talker.input_processor=thinker_to_talker_unmasked",
    ]  # fmt: skip
    ours = {}
    t0 = time.perf_counter()
    with ServeProcess(server_args, threads=args.threads) as server:
        startup = time.perf_counter() - t0
        asyncio.run(run_clients(server.base_url, 2, 2, args, offset=10_000))  # warm-up
        for i, c in enumerate(args.concurrency):
            # Distinct prompts per level: nothing is served from the prefix cache of an earlier one.
            ours[c] = summary(asyncio.run(run_clients(server.base_url, c, n, args, offset=i * n)))
            print(f"omni serve, {c} clients: {ours[c]}", flush=True)

    model = load_hf(model_dir)
    pre = OmniPreprocessor(model_dir)
    tok = pre.tokenizer
    hf_timings(model, pre, chat_prompt(tok, messages(10_000))["prompt"], args)  # warm-up
    durations = [
        hf_timings(model, pre, chat_prompt(tok, messages(i))["prompt"], args) for i in range(n)
    ]
    hf = {c: summary(replay(durations, c)) for c in args.concurrency}

    print(
        f"\n## omni serve vs transformers generate: {n} requests per level, text + audio out, "
        f"thinker {args.thinker_tokens} tokens, talker <= {args.talker_tokens} codes, "
        f"{args.size} Qwen2.5-Omni, {args.threads} torch threads (server start-up {startup:.1f} s, "
        "not timed)"
    )
    header = ["clients", "side", "req/s", "TTFT p50", "TTFT p99", "first audio p50",
              "first audio p99", "e2e p50"]  # fmt: skip
    rows = []
    for c in args.concurrency:
        for name, s in (("omni serve", ours[c]), ("transformers", hf[c])):
            rows.append(
                [str(c), name, f"{s['rps']:.2f}"]
                + [
                    f"{s[k] * 1000:.0f} ms"
                    for k in ("ttft_p50", "ttft_p99", "ttfa_p50", "ttfa_p99", "e2e_p50")
                ]
            )
    table(header, rows)
    print("\nratios (transformers / omni serve: > 1 means omni serve is better)")
    header = [
        "clients",
        "req/s (omni/hf)",
        "TTFT p50",
        "TTFT p99",
        "first audio p50",
        "first audio p99",
    ]
    rows = []
    for c in args.concurrency:
        o, h = ours[c], hf[c]
        rows.append(
            [str(c), f"{o['rps'] / h['rps']:.2f}x"]
            + [f"{h[k] / o[k]:.2f}x" for k in ("ttft_p50", "ttft_p99", "ttfa_p50", "ttfa_p99")]
        )
    table(header, rows)


if __name__ == "__main__":
    main()
