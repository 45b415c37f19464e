"""Parts 1 and 2 of bench/gpu.py on the Qwen2.5-Omni checkpoint: transformers' generate one
request after another (hf_section), and our pipeline through AsyncOmni, one by one and N at once
(omni_section)."""

from __future__ import annotations

import argparse
import asyncio
import functools
import time
from typing import Any

import torch
from gpu_checkpoints import CODEC_EOS
from gpu_timing import allocated_gib, peak_gib, release, reset_peak, sync
from gpu_workload import SEED, STAGES, blocks_for, chat_ids, engine_overrides, omni_params

from omni import AsyncOmni, SamplingParams

SAMPLE_RATE = 24000  # transformers' token2wav output


# ---- 1. transformers -----------------------------------------------------------------------------
def load_hf(model_dir: str, device: str) -> Any:
    from transformers import Qwen2_5OmniForConditionalGeneration

    if device == "cuda":
        model = Qwen2_5OmniForConditionalGeneration.from_pretrained(
            model_dir, dtype=torch.bfloat16, device_map="cuda"
        )
    else:
        model = Qwen2_5OmniForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32)
    model.thinker.generation_config.eos_token_id = None  # exactly --text-tokens, as ours
    return model.eval()


def hf_request(model: Any, ids: list[int], args: argparse.Namespace) -> dict[str, float]:
    """One full generate; TTFT = the thinker's second forward starting (after a device sync)."""
    calls = 0
    first_token: float | None = None
    codes: list[int] = []
    forward, talker_generate = model.thinker.forward, model.talker.generate

    # functools.wraps: generate inspects the forward's signature to validate its kwargs.
    @functools.wraps(forward)
    def timed_forward(*args_: Any, **kwargs: Any) -> Any:
        nonlocal calls, first_token
        calls += 1
        if calls == 2:
            sync(args.device)
            first_token = time.perf_counter()
        return forward(*args_, **kwargs)

    @functools.wraps(talker_generate)
    def counted_generate(*args_: Any, **kwargs: Any) -> Any:
        out = talker_generate(*args_, **kwargs)
        codes.extend(out[0, kwargs["input_ids"].shape[1] :].tolist())
        return out

    input_ids = torch.tensor([ids], device=args.device)
    model.thinker.forward, model.talker.generate = timed_forward, counted_generate
    try:
        torch.manual_seed(SEED)
        sync(args.device)
        start = time.perf_counter()
        with torch.inference_mode():
            sequences, wav = model.generate(
                input_ids=input_ids,
                thinker_max_new_tokens=args.text_tokens,
                talker_max_new_tokens=args.codec_tokens,
                talker_do_sample=False,
            )
        sync(args.device)
        took = time.perf_counter() - start
    finally:
        del model.thinker.forward, model.talker.generate
    for i, code in enumerate(codes):
        if code in CODEC_EOS:
            codes = codes[:i]
            break
    audio_s = wav.numel() / SAMPLE_RATE
    ttft = (first_token - start) if first_token is not None else took
    return {
        "ttft": ttft,
        "ttfa": took,  # the audio comes with the return of generate
        "e2e": took,
        "rtf": took / audio_s if audio_s else float("nan"),
        "audio_s": audio_s,
        "text": sequences.shape[1] - len(ids),
        "codes": len(codes),
    }


def hf_section(model_dir: str, tokenizer: Any, args: argparse.Namespace) -> dict[str, Any]:
    reset_peak(args.device)
    t0 = time.perf_counter()
    model = load_hf(model_dir, args.device)
    load_s = time.perf_counter() - t0
    prompts = [chat_ids(tokenizer, args.prompt_tokens, (9, i)) for i in range(args.hf_requests + 1)]
    hf_request(model, prompts[0], args)  # warm-up, not reported
    rows = []
    for ids in prompts[1:]:
        rows.append(hf_request(model, ids, args))
        r = rows[-1]
        print(
            f"  transformers request {len(rows)}: {r['e2e']:.2f} s, TTFT {r['ttft'] * 1e3:.0f} ms, "
            f"{r['audio_s']:.2f} s of audio",
            flush=True,
        )
    peak = peak_gib(args.device)
    del model
    release(args.device)
    return {"rows": rows, "load_s": load_s, "peak": peak, "left": allocated_gib(args.device)}


# ---- 2. omni -------------------------------------------------------------------------------------
def omni_engine_overrides(args: argparse.Namespace) -> dict[str, Any]:
    overrides = engine_overrides(args, STAGES)
    seqs = args.max_num_seqs
    thinker_tokens = args.prompt_tokens + args.text_tokens
    talker_tokens = args.prompt_tokens + 2 + args.codec_tokens  # prompt rows + speaker + g_0
    for stage, tokens in (("thinker", thinker_tokens), ("talker", talker_tokens)):
        overrides[f"stages.{stage}.engine.max_num_seqs"] = seqs
        overrides[f"stages.{stage}.engine.max_num_batched_tokens"] = args.max_num_batched_tokens
        overrides[f"stages.{stage}.engine.num_blocks"] = blocks_for(seqs, tokens)
        overrides[f"stages.{stage}.engine.max_model_len"] = max(4096, tokens + 16)
    # On a GPU a batch of chunks costs about one: no code budget short of the batch itself.
    overrides["stages.token2wav.engine.max_num_batched_tokens"] = 1 << 20
    if args.t2w_batch:
        overrides["stages.token2wav.engine.max_num_seqs"] = args.t2w_batch
    return overrides


async def omni_request(engine: AsyncOmni, ids: list[int], params: list[SamplingParams]) -> dict:
    start = time.perf_counter()
    audio_stage = engine.audio_stage
    ttft = ttfa = None
    last = None
    async for out in engine.generate({"prompt_token_ids": ids}, params, stream_audio=True):
        now = time.perf_counter() - start
        thinker = out.stages.get("thinker")
        if ttft is None and thinker is not None and thinker.token_ids:
            ttft = now
        audio = out.final.audio
        if ttfa is None and out.final.stage == audio_stage and audio is not None and audio.numel():
            ttfa = now
        last = out
    e2e = time.perf_counter() - start
    if last is None or last.error or not last.finished:
        why = "no output" if last is None else last.error or "not finished"
        raise SystemExit(f"omni request failed: {why}")
    final = last.final
    audio_s = final.audio.numel() / final.sample_rate if final.audio is not None else 0.0
    row = {
        "ttft": e2e if ttft is None else ttft,
        "ttfa": e2e if ttfa is None else ttfa,
        "e2e": e2e,
        "rtf": final.timings.get("rtf", float("nan")),
        "audio_s": audio_s,
        "text": len(last.stages["thinker"].token_ids),
        "codes": len(last.stages["talker"].token_ids),
    }
    # Pipeline times since the request was added, per stage: where the first audio waits.
    for name, result in last.stages.items():
        for key in ("first_token_s", "finished_s", "first_audio_s"):
            if key in result.timings:
                row[f"{name} {key}"] = result.timings[key]
    return row


def counters(engine: AsyncOmni) -> dict[str, float]:
    out: dict[str, float] = {}
    for name, stats in engine.stats().items():
        for key in ("steps", "preemptions"):
            if isinstance(stats.get(key), int | float):
                out[f"{name} {key}"] = float(stats[key])
    return out


async def omni_level(
    engine: AsyncOmni, prompts: list[list[int]], args: argparse.Namespace, at_once: bool
) -> dict[str, Any]:
    """All prompts launched at once (at_once) or one after another; wall = the whole level."""
    params = omni_params(args)
    reset_peak(args.device)
    before = counters(engine)
    start = time.perf_counter()
    if at_once:
        rows = list(await asyncio.gather(*(omni_request(engine, p, params) for p in prompts)))
    else:
        rows = [await omni_request(engine, p, params) for p in prompts]
    wall = time.perf_counter() - start
    after = counters(engine)
    return {
        "rows": rows,
        "wall": wall,
        "peak": peak_gib(args.device),
        "counters": {k: v - before.get(k, 0.0) for k, v in after.items()},
    }


async def omni_section(model_dir: str, tokenizer: Any, args: argparse.Namespace) -> dict:
    reset_peak(args.device)
    t0 = time.perf_counter()
    results: dict[str, Any] = {}
    async with AsyncOmni(model=model_dir, **omni_engine_overrides(args)) as engine:
        results["startup_s"] = time.perf_counter() - t0
        results["load_peak"] = peak_gib(args.device)
        offset = 1000
        if args.warmup:  # both the one-at-a-time and the batched paths; not reported
            warm = [
                chat_ids(tokenizer, args.prompt_tokens, (offset, i)) for i in range(args.warmup + 1)
            ]
            await omni_level(engine, warm[:1], args, at_once=False)
            await omni_level(engine, warm[1 : 1 + args.warmup], args, at_once=True)
        levels: list[tuple[str, dict]] = []
        if args.single:
            prompts = [chat_ids(tokenizer, args.prompt_tokens, (1, i)) for i in range(args.single)]
            levels.append(("single", await omni_level(engine, prompts, args, at_once=False)))
            print(f"  omni single: {levels[-1][1]['wall']:.2f} s", flush=True)
        for n in args.requests:
            prompts = [chat_ids(tokenizer, args.prompt_tokens, (2, n, i)) for i in range(n)]
            levels.append((str(n), await omni_level(engine, prompts, args, at_once=True)))
            print(f"  omni {n} at once: {levels[-1][1]['wall']:.2f} s", flush=True)
        results["levels"] = levels
        results["config"] = {s.name: s.engine for s in engine.config.stages}
    release(args.device)
    results["left"] = allocated_gib(args.device)
    return results
