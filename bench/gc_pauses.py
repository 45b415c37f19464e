"""Garbage-collector pauses while a pipeline serves, with the start-up objects frozen (as omni
starts: omni/backends/gc_freeze.py) and, as the baseline in the same run (first, in a fresh
process), without the freeze (gc_freeze's calls replaced by no-ops, in this bench only).

A full (generation 2) collection walks every object the collector tracks; while it runs, the
collector holds the GIL and every thread of the process stops: the stages of the local backend,
the driver, the caller's event loop. This bench serves --rounds rounds of --batch concurrent
requests (the tiny qwen2 checkpoint as a plain decoder on the local backend, --tokens tokens
each) and times every collection through `gc.callbacks`. It prints, per mode, the objects the
collector tracked at the start, each generation's collections with their total and longest
pause, and the wall time. Nothing is asserted; the number of full collections depends on how
many objects serving promotes, so a longer run shows more of them.

    python bench/gc_pauses.py [--batch 64] [--tokens 600] [--rounds 4]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import sys
import time
from pathlib import Path
from typing import Any
from unittest import mock

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bench_table import table  # noqa: E402

from omni import AsyncOmni, SamplingParams  # noqa: E402
from omni.backends import gc_freeze  # noqa: E402
from tools.make_tiny_checkpoint import ensure_checkpoint  # noqa: E402


class PauseClock:
    """Every collection's generation and length, from gc.callbacks."""

    def __init__(self) -> None:
        self.pauses: list[tuple[int, float]] = []
        self._start = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.pauses.append((info["generation"], time.perf_counter() - self._start))


async def serve(args: argparse.Namespace, frozen: bool) -> tuple[int, PauseClock, float]:
    overrides = {
        "runtime": {"backend": "local"},
        "stages.llm.engine.device": "cpu",
        "stages.llm.engine.max_num_seqs": args.batch,
    }
    with contextlib.ExitStack() as stack:
        if not frozen:  # the baseline: omni as it started before gc_freeze (run first, so that
            # the collector's counts are a fresh process's)
            stack.enter_context(mock.patch.object(gc_freeze, "freeze_started", lambda: None))
            stack.enter_context(mock.patch.object(gc_freeze, "release", lambda: None))
        return await _serve(args, overrides)


async def _serve(args: argparse.Namespace, overrides: dict) -> tuple[int, PauseClock, float]:
    async with AsyncOmni(model=args.model, **overrides) as omni:
        tracked = len(gc.get_objects())
        clock = PauseClock()
        params = SamplingParams(max_tokens=args.tokens, ignore_eos=True)

        async def one(key: int) -> None:
            ids = [(7 * key + 3 * j) % 500 + 1 for j in range(100 + key % 16)]
            async for _ in omni.generate(ids, params):
                pass

        gc.callbacks.append(clock)
        start = time.perf_counter()
        try:
            for r in range(args.rounds):
                await asyncio.gather(*(one(r * args.batch + i) for i in range(args.batch)))
        finally:
            gc.callbacks.remove(clock)
        return tracked, clock, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=600)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--model", help="a causal LM checkpoint (default: the tiny qwen2)")
    args = parser.parse_args()
    args.model = args.model or str(ensure_checkpoint("qwen2", "tiny"))
    print(
        f"{args.rounds} rounds of {args.batch} requests x {args.tokens} tokens, local backend, "
        f"{os.cpu_count()} CPUs\n"
    )
    rows = []
    for frozen in (False, True):
        tracked, clock, wall = asyncio.run(serve(args, frozen))
        for generation in (0, 1, 2):
            pauses = [s for g, s in clock.pauses if g == generation]
            rows.append(
                [
                    "frozen (omni)" if frozen else "unfrozen (baseline)",
                    f"{tracked:,}",
                    str(generation),
                    str(len(pauses)),
                    f"{sum(pauses) * 1e3:.0f}",
                    f"{max(pauses, default=0.0) * 1e3:.1f}",
                    f"{wall:.2f}",
                ]
            )
    table(
        ["start-up objects", "tracked", "generation", "collections", "total ms", "longest ms",
         "wall s"],
        rows,
    )  # fmt: skip


if __name__ == "__main__":
    main()
