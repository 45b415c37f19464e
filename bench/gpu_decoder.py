"""Parts 3 and 4 of bench/gpu.py on a plain decoder as a one-stage pipeline: time to first token
on a shared prefix, prefix caching on and off (prefix_pass), and the live engine's step split
into its parts while requests decode together (steps_section). Part 5 (bench/gpu_decode.py)
drives its engines with the same decode_overrides, decode_batch and timed_levels."""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any, cast

from gpu_timing import StageProcessTimer, StepTimer, peak_gib, release, reset_peak
from gpu_workload import blocks_for, engine_overrides, random_ids

from omni import AsyncOmni, SamplingParams


# ---- 3. decoder: shared prefix -------------------------------------------------------------------
def decoder_overrides(
    args: argparse.Namespace, caching: bool, seqs: int, tokens: int, max_len: int
) -> dict[str, Any]:
    overrides = engine_overrides(args, ("llm",))
    overrides["stages.llm.engine.enable_prefix_caching"] = caching
    overrides["stages.llm.engine.max_num_seqs"] = seqs
    overrides["stages.llm.engine.max_num_batched_tokens"] = args.llm_batched_tokens
    overrides["stages.llm.engine.num_blocks"] = blocks_for(seqs, tokens)
    overrides["stages.llm.engine.max_model_len"] = max_len
    return overrides


async def first_token(engine: AsyncOmni, ids: list[int]) -> dict[str, float]:
    start = time.perf_counter()
    took = None
    last = None
    async for out in engine.generate(ids, SamplingParams(max_tokens=1, ignore_eos=True)):
        if took is None and out.final.token_ids:
            took = time.perf_counter() - start
        last = out
    if last is None or last.error or took is None:
        raise SystemExit(f"decoder request failed: {None if last is None else last.error}")
    return {"ttft": took, "hit": float(last.final.num_cached_tokens)}


async def prefix_pass(model_dir: str, tokenizer: Any, args: argparse.Namespace, caching: bool):
    prompt_len = args.prefix_tokens + args.suffix_tokens
    max_len = -(-(prompt_len + 64) // 16) * 16
    overrides = decoder_overrides(args, caching, 4, prompt_len + 16, max_len)
    prefix = random_ids(tokenizer, args.prefix_tokens, (3,))
    reset_peak(args.device)
    async with AsyncOmni(model=model_dir, **overrides) as engine:
        # Warm-up: a prompt of the same length with another prefix (nothing shared with below).
        await first_token(engine, random_ids(tokenizer, prompt_len, (4,)))
        rows = []
        for i in range(args.prefix_requests):
            ids = prefix + random_ids(tokenizer, args.suffix_tokens, (5, i))
            before = engine.stats()["llm"]
            row = await first_token(engine, ids)
            after = engine.stats()["llm"]
            # How its steps ran: replayed graphs (long: keys split), and eager steps.
            keys = ("graph_steps", "long_context_steps", "eager_steps")
            row["steps"] = "/".join(str(after.get(k, 0) - before.get(k, 0)) for k in keys)
            rows.append(row)
        peak = peak_gib(args.device)
    release(args.device)
    return rows, peak


# ---- 4. decoder: CPU time of a decode step -------------------------------------------------------
def decode_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The decoder engine of parts 4 and 5: max(--decode-batch) sequences of prompt + budget."""
    seqs = max(args.decode_batch)
    tokens = args.decode_prompt_tokens + args.decode_tokens
    return decoder_overrides(args, True, seqs, tokens, -(-(tokens + 64) // 16) * 16)


async def decode_batch(
    engine: AsyncOmni, tokenizer: Any, args: argparse.Namespace, batch: int, key: int, tokens: int
) -> float:
    """`batch` distinct --decode-prompt-tokens prompts launched at once, each decoding exactly
    `tokens` tokens; returns the wall time."""
    prompts = [
        random_ids(tokenizer, args.decode_prompt_tokens, (6, key, batch, i)) for i in range(batch)
    ]
    params = SamplingParams(max_tokens=tokens, ignore_eos=True)

    async def one(ids: list[int]) -> None:
        async for _ in engine.generate(ids, params):
            pass

    start = time.perf_counter()
    await asyncio.gather(*(one(p) for p in prompts))
    return time.perf_counter() - start


async def timed_levels(
    engine: AsyncOmni,
    timer: StepTimer | StageProcessTimer,
    tokenizer: Any,
    args: argparse.Namespace,
) -> list[dict]:
    """A warm-up, then each --decode-batch B: its wall, the timer's step records and the
    decoder stage's stats before and after (engine.stats()["llm"])."""
    await decode_batch(engine, tokenizer, args, min(args.decode_batch), 0, 8)
    timer.take()  # the warm-up's steps
    out = []
    for batch in args.decode_batch:
        before = engine.stats()["llm"]
        wall = await decode_batch(engine, tokenizer, args, batch, 1, args.decode_tokens)
        records = timer.take()
        after = engine.stats()["llm"]
        out.append(
            {"batch": batch, "wall": wall, "records": records, "before": before, "after": after}
        )
    return out


async def steps_section(model_dir: str, tokenizer: Any, args: argparse.Namespace) -> list[dict]:
    async with AsyncOmni(model=model_dir, **decode_overrides(args)) as engine:
        host = cast(Any, engine._driver().backend).hosts["llm"]
        timer = StepTimer()
        timer.install(host)
        try:
            out = await timed_levels(engine, timer, tokenizer, args)
        finally:
            timer.uninstall()
    release(args.device)
    return out
