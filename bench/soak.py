"""A soak through `omni serve`: N requests (default 10,000) from C concurrent clients (default
32, the official `openai` client, async) mixing chat text, chat with audio in, streamed chat with
audio out, /v1/audio/speech, /v1/completions, clients that leave mid-request, bad requests and
cache salts, against a real server subprocess (the tiny Qwen2.5-Omni). Every answer is compared
with its prompt's reference (greedy); at the end the server must hold no request and no KV block
in any stage, and its RSS must not grow 5% or more over the second half. Prints the tables;
exits 1 on any failure. The run itself: tools/soak.py; docs/soak.md has a measured run.

    .venv/bin/python bench/soak.py [--requests 10000] [--concurrency 32] [--backend local|ray|processes]
        [--prompts 20] [--max-tokens 8] [--talker-tokens 16] [--seed 0] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import argparse  # noqa: E402
import asyncio  # noqa: E402
import time  # noqa: E402

from bench_table import table  # noqa: E402

from tools.make_tiny_checkpoint import ensure_checkpoint  # noqa: E402
from tools.serve_process import ServeProcess  # noqa: E402
from tools.soak import (  # noqa: E402
    SERVER_ENV,
    SoakConfig,
    SoakReport,
    percentile_ms,
    run_soak,
    server_args,
)

MIB = 1 << 20


def progress(report: SoakReport) -> None:
    last = report.rss[-1]
    errors = sum(s.errors + s.diverged for s in report.kinds.values())
    print(
        f"  {last.num_done:>6} requests  {report.wall_s:7.1f} s  errors+diverged {errors}  "
        f"server RSS {last.server_bytes / MIB:.0f} MiB (tree {last.tree_bytes / MIB:.0f} MiB)",
        flush=True,
    )


def _blocks(value: float | None) -> str:
    return "- (no KV cache)" if value is None else f"{value:.0f}"


def print_report(report: SoakReport) -> None:
    rows = []
    for kind, s in report.kinds.items():
        rows.append(
            [kind, str(s.count), str(s.errors), str(s.diverged)]
            + [str(s.left_early) if kind == "disconnect" else "-"]
            + [percentile_ms(s.latencies_s, q) for q in (50, 99)]
            + [percentile_ms(s.ttfas_s, q) for q in (50, 99)]
        )
    header = [
        "kind",
        "count",
        "errors",
        "diverged",
        "left early",
        "p50 ms",
        "p99 ms",
        "p50 TTFA ms",
    ]
    table(header + ["p99 TTFA ms"], rows)
    print()
    table(
        ["requests", "server RSS MiB", "with descendants MiB"],
        [
            [str(r.num_done), f"{r.server_bytes / MIB:.1f}", f"{r.tree_bytes / MIB:.1f}"]
            for r in report.rss
        ],
    )
    growth = report.rss_growth()
    if growth is not None:
        print(f"\nRSS growth over the second half: server {growth[0]:+.2%}, tree {growth[1]:+.2%}")
    print()
    end = report.end
    if end is not None:
        table(
            ["stage", "kv_blocks_in_use", "num_requests"],
            [
                [stage, _blocks(v.get("kv_blocks_in_use")), f"{v.get('num_requests', 0):.0f}"]
                for stage, v in end.stages.items()
            ],
        )
        print(f"\nomni_requests_running {end.running:.0f}, omni_requests_waiting {end.waiting:.0f}")
    done = sum(s.count for s in report.kinds.values())
    print(
        f"{done} requests (+{report.num_references} references) in {report.wall_s:.0f} s: "
        f"{done / max(report.wall_s, 1e-9):.1f} requests/s"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--backend", default="local", choices=["local", "ray", "processes"])
    parser.add_argument("--prompts", type=int, default=20)
    parser.add_argument("--max-tokens", type=int, default=8, help="thinker tokens per chat")
    parser.add_argument("--talker-tokens", type=int, default=16, help="codes per audio answer")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the server")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="config override"
    )
    args = parser.parse_args()
    config = SoakConfig(
        num_requests=args.requests,
        concurrency=args.concurrency,
        num_prompts=args.prompts,
        max_tokens=args.max_tokens,
        seed=args.seed,
    )
    model_dir = str(ensure_checkpoint("qwen2_5_omni", "tiny"))
    t0 = time.perf_counter()
    serve = server_args(model_dir, args.backend, args.talker_tokens, args.max_tokens)
    serve += [arg for override in args.set for arg in ("--set", override)]
    with ServeProcess(serve, threads=args.threads, env=SERVER_ENV) as server:
        assert server.proc is not None
        print(f"omni serve ({args.backend}) ready in {time.perf_counter() - t0:.1f} s", flush=True)
        report = asyncio.run(run_soak(server.base_url, server.proc.pid, config, progress=progress))
    print()
    print_report(report)
    failures = report.failures()
    for failure in failures:
        print(f"FAIL: {failure}")
    print("FAIL" if failures else "PASS: nothing lost, no block or request left, RSS flat")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
