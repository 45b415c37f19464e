"""Concurrency sweep through AsyncOmni on the Qwen2.5-Omni pipeline (thinker -> talker -> token2wav).

For each concurrency level C, --requests N distinct text prompts go through one always-on
`AsyncOmni` with at most C in flight at once (an asyncio.Semaphore: a new request starts as soon
as one finishes, i.e. C closed-loop callers). Fixed budgets per stage: thinker exactly
--thinker-tokens (ignore_eos), greedy talker up to --talker-tokens codes stopping at the codec
EOS ids, one token2wav pass with a fixed seed. Per request, measured from the moment `generate`
is called (tokenization included):

  TTFT   the first snapshot whose thinker token_ids is non-empty
  TTFA   the first snapshot that carries audio (the vocoder returns audio only at the end of a
         request, so today this equals e2e)
  e2e    the finished snapshot

Per level: wall time, requests/s and its ratio to the first level (the baseline, C=1 by default)
measured in the same run, TTFT / TTFA / e2e percentiles, and the thinker / talker / token2wav
engine steps the level took (from `engine.stats()`), with generated tokens per step = the mean
batch size of a step. Every level uses its own prompts, so nothing hits the prefix cache across
levels; the pipeline is warmed up with a couple of requests first (not timed).

Checks (the script fails otherwise): every request finishes without error, with exactly
--thinker-tokens thinker tokens, at most --talker-tokens codes and a waveform.

    .venv/bin/python bench/async_concurrency.py [--size tiny|bench] [--backend local|ray]
        [--concurrency 1,8,64] [--requests 64] [--thinker-tokens 16] [--talker-tokens 48]
        [--max-num-seqs N] [--threads 2]
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # tools/ is not an installed package
sys.path.insert(0, str(REPO / "bench"))
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import argparse  # noqa: E402
import asyncio  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from bench_table import table  # noqa: E402
from omni_bench_support import CODEC_EOS, SEED, SUBJECTS, prepare_model  # noqa: E402

from omni import AsyncOmni, SamplingParams  # noqa: E402

STAGES = ("thinker", "talker", "token2wav")


def prompt(level: int, i: int) -> str:
    """A distinct chat prompt per (level, index). The ids come first, so prompts differ within
    their first KV block (block size 16) and no request hits the prefix cache."""
    subject = SUBJECTS[i % len(SUBJECTS)]
    text = f"#{level}-{i}: Tell me about {subject} in a few words."
    return f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"


def stage_params(args) -> list[SamplingParams]:
    return [
        SamplingParams(max_tokens=args.thinker_tokens, ignore_eos=True),
        SamplingParams(max_tokens=args.talker_tokens, stop_token_ids=CODEC_EOS),
        SamplingParams(max_tokens=1, seed=SEED),
    ]


async def one_request(engine: AsyncOmni, text: str, params, args) -> dict:
    start = time.perf_counter()
    ttft = ttfa = None
    last = None
    async for out in engine.generate(text, params):
        now = time.perf_counter() - start
        thinker = out.stages.get("thinker")
        if ttft is None and thinker is not None and thinker.token_ids:
            ttft = now
        if ttfa is None and any(r.audio is not None for r in out.stages.values()):
            ttfa = now
        last = out
    e2e = time.perf_counter() - start
    return {"ttft": ttft, "ttfa": ttfa, "e2e": e2e, "out": last}


def check(result: dict, args) -> str | None:
    """Why a request does not count as finished cleanly, or None."""
    out = result["out"]
    if out is None or not out.finished:
        return "no finished snapshot"
    if out.error or any(r.error for r in out.stages.values()):
        return f"error: {out.error or [r.error for r in out.stages.values() if r.error]}"
    if set(out.stages) != set(STAGES):
        return f"stages {sorted(out.stages)}"
    if len(out.stages["thinker"].token_ids) != args.thinker_tokens:
        return f"{len(out.stages['thinker'].token_ids)} thinker tokens"
    if not 0 < len(out.stages["talker"].token_ids) <= args.talker_tokens:
        return f"{len(out.stages['talker'].token_ids)} talker codes"
    if out.final.audio is None or out.final.audio.numel() == 0:
        return "no audio"
    if result["ttft"] is None or result["ttfa"] is None:
        return "no thinker token or no audio snapshot"
    return None


async def run_level(engine: AsyncOmni, level: int, concurrency: int, n: int, args) -> dict:
    params = stage_params(args)
    semaphore = asyncio.Semaphore(concurrency)
    in_flight = peak = 0

    async def caller(i: int) -> dict:
        nonlocal in_flight, peak
        async with semaphore:
            in_flight += 1
            peak = max(peak, in_flight)
            try:
                return await one_request(engine, prompt(level, i), params, args)
            finally:
                in_flight -= 1

    before = engine.stats()
    start = time.perf_counter()
    results = await asyncio.gather(*(caller(i) for i in range(n)))
    wall = time.perf_counter() - start
    after = engine.stats()
    problems = [(i, why) for i, r in enumerate(results) if (why := check(r, args))]
    assert not problems, f"C={concurrency}: {len(problems)}/{n} requests failed: {problems[:5]}"
    assert peak <= concurrency, (peak, concurrency)
    steps = {s: after[s]["steps"] - before[s]["steps"] for s in STAGES}
    tokens = {
        s: sum(len(r["out"].stages[s].token_ids) for r in results) for s in ("thinker", "talker")
    }
    return {
        "concurrency": concurrency,
        "peak": peak,
        "wall": wall,
        "results": results,
        "steps": steps,
        "tokens": tokens,
        "kv_hits": after["thinker"]["kv_hit_tokens"] - before["thinker"]["kv_hit_tokens"],
        "t2w_busy": after["token2wav"].get("busy_s", 0.0) - before["token2wav"].get("busy_s", 0.0),
    }


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q))


async def sweep(model_dir: str, args, levels: list[int]) -> tuple[float, list[dict], dict]:
    overrides: dict = {"runtime": {"backend": args.backend}}
    if args.max_num_seqs:
        for stage in ("thinker", "talker"):
            overrides[f"stages.{stage}.engine.max_num_seqs"] = args.max_num_seqs
    t0 = time.perf_counter()
    async with AsyncOmni(model=model_dir, **overrides) as engine:
        startup = time.perf_counter() - t0
        await run_level(engine, 0, 2, args.warmup, args)  # warm-up: two at once, not reported
        runs = []
        for k, c in enumerate(levels, start=1):
            runs.append(await run_level(engine, k, c, args.requests, args))
            print(f"  C={c}: {runs[-1]['wall']:.1f} s", flush=True)
        return startup, runs, engine.stats()


def report(runs: list[dict], args) -> None:
    base = runs[0]
    base_rps = args.requests / base["wall"]
    rows = []
    for r in runs:
        rps = args.requests / r["wall"]
        ttft = [x["ttft"] * 1e3 for x in r["results"]]
        ttfa = [x["ttfa"] * 1e3 for x in r["results"]]
        e2e = [x["e2e"] * 1e3 for x in r["results"]]
        steps, tokens = r["steps"], r["tokens"]
        rows.append(
            (
                str(r["concurrency"]),
                str(r["peak"]),
                f"{r['wall']:.2f}",
                f"{rps:.2f}",
                f"{rps / base_rps:.2f}x",
                f"{pct(ttft, 50):.0f}",
                f"{pct(ttft, 99):.0f}",
                f"{pct(ttfa, 50):.0f}",
                f"{pct(e2e, 50):.0f}",
                f"{pct(e2e, 99):.0f}",
                f"{steps['thinker']} ({tokens['thinker'] / max(steps['thinker'], 1):.1f})",
                f"{steps['talker']} ({tokens['talker'] / max(steps['talker'], 1):.1f})",
                f"{steps['token2wav']} ({r['t2w_busy']:.1f})",
            )
        )
    header = (
        "C",
        "peak",
        "wall s",
        "req/s",
        f"vs C={base['concurrency']}",
        "TTFT p50 ms",
        "TTFT p99 ms",
        "TTFA p50 ms",
        "e2e p50 ms",
        "e2e p99 ms",
        "thinker steps (tok/step)",
        "talker steps (tok/step)",
        "t2w steps (busy s)",
    )
    table(header, rows)
    print(
        f"\nreq/s ratio against C={base['concurrency']} (same run): "
        + ", ".join(f"C={r['concurrency']} {base['wall'] / r['wall']:.2f}x" for r in runs)
    )
    hits = sum(r["kv_hits"] for r in runs)
    print(
        "peak = most requests in flight at once; tok/step = generated tokens / engine steps "
        "(the mean batch of a step); busy s = time token2wav spent running; TTFA = e2e while the vocoder returns audio only at the end; "
        f"thinker prefix-cache hit tokens over all levels: {hits}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", help="Qwen2.5-Omni checkpoint dir (default: built --size)")
    parser.add_argument("--size", default="tiny", choices=["tiny", "bench"])
    parser.add_argument("--backend", default="local", choices=["local", "ray"])
    parser.add_argument("--threads", type=int, default=2, help="torch threads in this process")
    parser.add_argument("--concurrency", default="1,8,64", help="comma-separated levels")
    parser.add_argument("--requests", type=int, default=64, help="requests per level")
    parser.add_argument("--warmup", type=int, default=2, help="warm-up requests (not timed)")
    parser.add_argument("--thinker-tokens", type=int, default=16)
    parser.add_argument("--talker-tokens", type=int, default=48)
    parser.add_argument(
        "--max-num-seqs", type=int, help="thinker and talker max_num_seqs (default: the config's)"
    )
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",") if c.strip()]
    if not levels or min(levels) < 1:
        parser.error(f"--concurrency needs positive integers, got {args.concurrency!r}")
    model_dir, setup = prepare_model(args)
    print("# AsyncOmni concurrency sweep, Qwen2.5-Omni pipeline (random weights)")
    print(f"{setup}, torch {torch.__version__}")
    print(
        f"{args.requests} requests per level, concurrency {levels}; thinker {args.thinker_tokens} "
        f"tokens (ignore_eos), talker <= {args.talker_tokens} codes (greedy, stop {CODEC_EOS}), "
        f"token2wav 1 pass (seed {SEED}); max_num_seqs "
        f"{args.max_num_seqs or 'from the stage config'}; {args.warmup} warm-up requests"
    )
    start = time.perf_counter()
    startup, runs, stats = asyncio.run(sweep(model_dir, args, levels))
    print(f"\n## Concurrency sweep (engine startup {startup:.1f} s, not timed)")
    report(runs, args)
    print("\nengine.stats() at the end, cumulative (warm-up included):")
    for stage, s in stats.items():
        extra = f", finished {s['finished']}" if "finished" in s else ""
        kv = f", kv hit tokens {s['kv_hit_tokens']}" if "kv_hit_tokens" in s else ""
        print(f"  {stage}: steps {s['steps']}{extra}{kv}, preemptions {s.get('preemptions', 0)}")
    print(f"\ntotal {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
