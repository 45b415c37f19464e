"""GPU benchmark: Qwen2.5-Omni at the 7B layout, omni against transformers, plus a 0.5B decoder.

Prints the device, then (each part optional, see --skip):

1. hf: transformers' `Qwen2_5OmniForConditionalGeneration.generate`, one request after another
   (after a warm-up): a --prompt-tokens prompt, exactly --text-tokens thinker tokens and
   --codec-tokens codec codes (the random checkpoint's codec-head rows of the codec EOS ids are
   zero, so greedy decoding never stops early, on either side), one token2wav pass. TTFT: the
   thinker's second forward starting (its first token sampled); its first audio is the end of
   the whole generate.
2. omni: the same checkpoint and budgets through our pipeline (AsyncOmni.generate with
   stream_audio: talker started early, vocoder in chunks), runtime backend local: --single
   requests one after another, then for each N in --requests, N distinct requests launched at
   once. Per request, from its launch: TTFT (first snapshot with a thinker token), TTFA (first
   snapshot carrying audio), RTF (timings["rtf"]: pipeline time / audio seconds), e2e.
   Throughput = N / wall of the level; transformers' = 1 / its mean generate time. Peak memory:
   torch.cuda.max_memory_allocated over the level (weights included; n/a on the CPU).
3. prefix: a plain decoder of Qwen2.5-0.5B's layout (random weights) as a one-stage pipeline:
   --prefix-requests requests sharing a --prefix-tokens prefix (each with its own suffix) sent
   one after another, prefix caching on and off: time to first token (max_tokens=1).
4. steps: the same decoder, --decode-batch requests decoding together; the live StageEngine's
   `scheduler.schedule`, `runner.execute`, `update` and `step` (and its host's `run_once`) are
   wrapped with timers: the CPU time of schedule + update per decode step as a share of the step.

Random weights: the text and the audio are noise; only the timings mean anything. Nothing about
timings is asserted; ratios are against the baseline measured in the same run. A part that fails
is reported (traceback) and the others still run; the exit status is then non-zero.

Checkpoints are written once into the checkpoint cache (<repo>/.cache/checkpoints, or
$OMNI_CACHE_DIR/checkpoints) and reused: the 7B layout takes about 21 GiB of disk, the 0.5B
layout 1 GiB. On the lent GPU machine (no network, no Ray, an older transformers), first run
../shared/tools/device-wheels.sh here, then carry [".whl"] and start the command with its prefix.

    python bench/gpu.py [--device cuda|cpu] [--size 7b|tiny] [--requests 16,64] [--single 3]
        [--hf-requests 3] [--prompt-tokens 200] [--text-tokens 64] [--codec-tokens 256]
        [--prefix-tokens 4096] [--decode-batch 16,64] [--skip hf|omni|prefix|steps ...]
    python bench/gpu.py --device cpu --size tiny --requests 2,4 --single 1 --hf-requests 1 \\
        --prefix-tokens 512 --decode-batch 2,4 --decode-tokens 16     # a smoke test on a CPU
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # tools/ is not an installed package
sys.path.insert(0, str(REPO / "bench"))
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import argparse  # noqa: E402
import asyncio  # noqa: E402
import functools  # noqa: E402
import math  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402
from typing import Any, TypeVar, cast  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from gpu_support import (  # noqa: E402
    CODEC_EOS,
    StepRecord,
    StepTimer,
    allocated_gib,
    decoder_checkpoint,
    device_line,
    gib,
    omni_checkpoint,
    peak_gib,
    release,
    reset_peak,
    sync,
)

from omni import AsyncOmni, SamplingParams  # noqa: E402
from tools.make_tiny_checkpoint import count_parameters  # noqa: E402

T = TypeVar("T")
STAGES = ("thinker", "talker", "token2wav")
AR_STAGES = ("thinker", "talker")
SEED = 0  # DiT noise seed of every request
SAMPLE_RATE = 24000  # transformers' token2wav output
ISSUE_SCALE = (
    "for scale (the issue, one H100, 7B layout, same workload): transformers takes about "
    "7.6 s per request, all before the first audio (RTF 1.5, 0.14 requests/s one by one)"
)


# ---- workload ------------------------------------------------------------------------------------
def chat_ids(tokenizer: Any, num_tokens: int, key: tuple[int, ...]) -> list[int]:
    """A user turn in Qwen's chat framing, exactly num_tokens long: random ordinary tokens
    (seeded by `key`, so prompts differ from their first block on and never hit the prefix
    cache of another) between `<|im_start|>user\\n` and `<|im_end|>\\n<|im_start|>assistant\\n`."""
    head = tokenizer.encode("<|im_start|>user\n", add_special_tokens=False)
    tail = tokenizer.encode("<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    body = num_tokens - len(head) - len(tail)
    if body < 1:
        raise SystemExit(f"--prompt-tokens {num_tokens} is too short for the chat framing")
    return head + random_ids(tokenizer, body, key) + tail


def random_ids(tokenizer: Any, n: int, key: tuple[int, ...]) -> list[int]:
    """n ordinary (non-special) token ids, seeded by key."""
    ordinary = min(tokenizer.all_special_ids or [len(tokenizer)])
    return np.random.default_rng(list(key)).integers(0, ordinary, n).tolist()


def omni_params(args: argparse.Namespace) -> list[SamplingParams]:
    return [
        SamplingParams(max_tokens=args.text_tokens, ignore_eos=True),
        SamplingParams(max_tokens=args.codec_tokens, stop_token_ids=CODEC_EOS),
        SamplingParams(max_tokens=1, seed=SEED),
    ]


def blocks_for(num_seqs: int, tokens: int, block_size: int = 16) -> int:
    """KV blocks for num_seqs sequences of `tokens` tokens, with a quarter to spare."""
    return math.ceil(num_seqs * math.ceil((tokens + 1) / block_size) * 1.25) + 16


def engine_overrides(args: argparse.Namespace, stages: tuple[str, ...]) -> dict[str, Any]:
    """Device, dtype and memory share of each stage (bf16 on a GPU; float32 on the CPU, as the
    stage configs say); token2wav keeps float32, as transformers runs it."""
    overrides: dict[str, Any] = {"runtime": {"backend": "local"}}
    shares = dict(zip(STAGES, args.gpu_mem, strict=True))
    for stage in stages:
        overrides[f"stages.{stage}.engine.device"] = args.device
        if args.device == "cuda":
            share = shares.get(stage, args.gpu_mem[0])
            overrides[f"stages.{stage}.engine.gpu_memory_utilization"] = share
            if stage != "token2wav":
                overrides[f"stages.{stage}.engine.dtype"] = "bfloat16"
    return overrides


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


def pct(values: list[float], q: float) -> float:
    """The q-th percentile, linearly interpolated (with few values p99 is about the max)."""
    clean = [v for v in values if not math.isnan(v)]
    return float(np.percentile(clean, q)) if clean else float("nan")


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=True)]
    print("| " + " | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in rows:
        print("| " + " | ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) + " |")


def report_omni(hf: dict | None, ours: dict | None, args: argparse.Namespace) -> None:
    print(
        f"\n## Qwen2.5-Omni ({args.size} layout): omni vs transformers, {args.prompt_tokens}-token "
        f"prompt, {args.text_tokens} text tokens, {args.codec_tokens} codec codes"
    )
    notes = []
    if hf is not None:
        notes.append(
            f"transformers: load {hf['load_s']:.1f} s, {len(hf['rows'])} requests one by one after"
            f" a warm-up; GPU memory left after dropping it {gib(hf['left'])} GiB"
        )
    if ours is not None:
        seqs = ", ".join(f"{n} {e.max_num_seqs}" for n, e in ours["config"].items())
        blocks = ", ".join(
            f"{n} {e.num_blocks}" for n, e in ours["config"].items() if e.num_blocks is not None
        )
        notes.append(
            f"omni: startup {ours['startup_s']:.1f} s (peak {gib(ours['load_peak'])} GiB after "
            f"it), {args.warmup} warm-up requests; max_num_seqs {seqs}; num_blocks {blocks}; "
            f"GPU memory left after shutdown {gib(ours['left'])} GiB"
        )
    for note in notes:
        print(note)
    print(
        "C = requests launched at once (single: one after another); TTFT / TTFA / e2e from each "
        "request's launch; RTF = pipeline time / audio s per request; req/s: transformers = "
        "1 / mean generate time, omni = requests / wall of the level; x HF = req/s over "
        "transformers'; peak = torch.cuda.max_memory_allocated over the level (weights "
        "included)\n"
    )
    hf_rps = 1 / statistics.mean(r["e2e"] for r in hf["rows"]) if hf else None

    def row(name: str, c: str, rows: list[dict], rps: float, peak: float | None) -> tuple:
        def ms(key: str, q: float) -> str:
            return f"{pct([r[key] for r in rows], q) * 1e3:.0f}"

        return (
            name,
            c,
            str(len(rows)),
            f"{rps:.3f}",
            f"{rps / hf_rps:.2f}x" if hf_rps else "-",
            ms("ttft", 50),
            ms("ttft", 99),
            ms("ttfa", 50),
            ms("ttfa", 99),
            f"{pct([r['rtf'] for r in rows], 50):.3f}",
            f"{pct([r['e2e'] for r in rows], 50):.2f}",
            f"{statistics.mean(r['audio_s'] for r in rows):.2f}",
            f"{min(r['text'] for r in rows)}/{min(r['codes'] for r in rows)}",
            gib(peak),
        )

    header = (
        "system",
        "C",
        "reqs",
        "req/s",
        "x HF",
        "TTFT p50 ms",
        "TTFT p99 ms",
        "TTFA p50 ms",
        "TTFA p99 ms",
        "RTF p50",
        "e2e p50 s",
        "audio s/req",
        "min text/codes",
        "peak GiB",
    )
    rows = []
    if hf is not None and hf_rps is not None:
        rows.append(row("transformers", "1-by-1", hf["rows"], hf_rps, hf["peak"]))
    levels = dict(ours["levels"]) if ours is not None else {}
    for label, level in levels.items():
        rps = len(level["rows"]) / level["wall"]
        rows.append(row("omni", label, level["rows"], rps, level["peak"]))
    table(header, rows)

    if levels:
        print(
            "\nomni, where the time goes: p50 s since each request was added (the stages' "
            "timings); engine steps and preemptions during the level"
        )
        where_header = (
            "C",
            "thinker 1st tok",
            "thinker done",
            "talker 1st code",
            "talker done",
            "first audio",
            "audio done",
            "steps thinker/talker/t2w",
            "preemptions",
        )
        where = []
        for label, level in levels.items():
            got = level["rows"]

            def p50(key: str, got: list[dict] = got) -> str:
                return f"{pct([r.get(key, float('nan')) for r in got], 50):.3f}"

            cnt = level["counters"]
            steps = "/".join(f"{cnt.get(f'{s} steps', 0):.0f}" for s in STAGES)
            pre = sum(cnt.get(f"{s} preemptions", 0.0) for s in STAGES)
            where.append(
                (
                    label,
                    p50("thinker first_token_s"),
                    p50("thinker finished_s"),
                    p50("talker first_token_s"),
                    p50("talker finished_s"),
                    p50("token2wav first_audio_s"),
                    p50("token2wav finished_s"),
                    steps,
                    f"{pre:.0f}",
                )
            )
        table(where_header, where)

    print("\ntargets (same GPU and workload; reported, never asserted):")
    single = levels.get("single")
    if single is not None:
        ttfa = pct([r["ttfa"] for r in single["rows"]], 50) * 1e3
        print(
            f"  first audio, single request: p50 {ttfa:.0f} ms (target < 500 ms): {_ok(ttfa < 500)}"
        )
    for label, level in levels.items():
        if label == "single" or hf_rps is None:
            continue
        ratio = len(level["rows"]) / level["wall"] / hf_rps
        goal = " (target >= 10x at 16)" if label == "16" else ""
        verdict = f": {_ok(ratio >= 10)}" if label == "16" else ""
        print(
            f"  throughput at {label} concurrent: {ratio:.2f}x transformers one by one{goal}{verdict}"
        )
    for label, level in levels.items():
        rtf = pct([r["rtf"] for r in level["rows"]], 50)
        print(f"  RTF p50 at C={label}: {rtf:.3f} (target < 0.3): {_ok(rtf < 0.3)}")
    if hf is not None:
        hf_e2e = statistics.mean(r["e2e"] for r in hf["rows"])
        hf_rtf = pct([r["rtf"] for r in hf["rows"]], 50)
        print(f"  transformers here: {hf_e2e:.2f} s per request, RTF {hf_rtf:.2f}")
    if args.size == "7b":
        print(f"  {ISSUE_SCALE}")


def _ok(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


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
            rows.append(await first_token(engine, ids))
        peak = peak_gib(args.device)
    release(args.device)
    return rows, peak


def report_prefix(results: dict[bool, tuple[list[dict], float | None]], args) -> None:
    n = args.prefix_requests
    print(
        f"\n## Decoder ({args.decoder_layout} layout): time to first token on a shared "
        f"{args.prefix_tokens}-token prefix"
    )
    print(
        f"{n} requests one after another, each the prefix + its own {args.suffix_tokens}-token "
        f"suffix, max_tokens=1, after a warm-up request of the same length; "
        f"max_num_batched_tokens {args.llm_batched_tokens}; request 1 is cold either way. "
        f"Peak GPU memory: caching on {gib(results[True][1])} GiB, off {gib(results[False][1])} "
        "GiB\n"
    )
    rows = []
    for i in range(n):
        on, off = results[True][0][i], results[False][0][i]
        rows.append(
            (
                str(i + 1),
                f"{on['ttft'] * 1e3:.1f}",
                f"{on['hit']:.0f}/{args.prefix_tokens + args.suffix_tokens}",
                f"{off['ttft'] * 1e3:.1f}",
                f"{off['hit']:.0f}",
                f"{off['ttft'] / on['ttft']:.2f}x",
            )
        )
    header = ("req", "TTFT on ms", "hit tokens on", "TTFT off ms", "hit off", "off / on")
    table(header, rows)
    if n > 1:
        on = statistics.mean(r["ttft"] for r in results[True][0][1:])
        off = statistics.mean(r["ttft"] for r in results[False][0][1:])
        print(
            f"\nrequests 2..{n}: TTFT caching on {on * 1e3:.1f} ms, off {off * 1e3:.1f} ms: "
            f"{off / on:.2f}x faster with caching"
        )


# ---- 4. decoder: CPU time of a decode step -------------------------------------------------------
async def steps_section(model_dir: str, tokenizer: Any, args: argparse.Namespace) -> list[dict]:
    seqs = max(args.decode_batch)
    tokens = args.decode_prompt_tokens + args.decode_tokens
    overrides = decoder_overrides(args, True, seqs, tokens, -(-(tokens + 64) // 16) * 16)
    params = SamplingParams(max_tokens=args.decode_tokens, ignore_eos=True)
    out = []
    async with AsyncOmni(model=model_dir, **overrides) as engine:
        host = cast(Any, engine._driver().backend).hosts["llm"]
        timer = StepTimer()
        timer.install(host)
        try:

            async def run(batch: int, key: int, params: SamplingParams) -> float:
                prompts = [
                    random_ids(tokenizer, args.decode_prompt_tokens, (6, key, batch, i))
                    for i in range(batch)
                ]

                async def one(ids: list[int]) -> None:
                    async for _ in engine.generate(ids, params):
                        pass

                start = time.perf_counter()
                await asyncio.gather(*(one(p) for p in prompts))
                return time.perf_counter() - start

            await run(min(args.decode_batch), 0, SamplingParams(max_tokens=8, ignore_eos=True))
            timer.take()  # the warm-up's steps
            for batch in args.decode_batch:
                wall = await run(batch, 1, params)
                records = timer.take()
                out.append({"batch": batch, "wall": wall, "records": records})
        finally:
            timer.uninstall()
    release(args.device)
    return out


def report_steps(levels: list[dict], args: argparse.Namespace) -> None:
    print(
        f"\n## Decoder ({args.decoder_layout} layout): scheduler + bookkeeping CPU time per "
        "decode step"
    )
    print(
        f"B requests ({args.decode_prompt_tokens}-token distinct prompts, {args.decode_tokens} "
        "tokens each, ignore_eos) launched at once; decode steps = steps feeding one token per "
        "request with all B scheduled. schedule / update: the stepping thread's CPU time in "
        "scheduler.schedule and StageEngine.update; execute: wall time of runner.execute; step: "
        "wall time of StageEngine.step; host: the rest of the StageHost turn around the step "
        "(inbox, events); sched+update wall: their wall time (above the CPU time when the thread "
        "waits, e.g. for the GIL). share = (schedule + update CPU time) / step\n"
    )
    header = (
        "B",
        "decode steps",
        "schedule us",
        "update us",
        "execute ms",
        "step ms",
        "share of step",
        "sched+update wall us",
        "host extra us",
        "all steps",
        "tok/s",
    )
    rows = []
    for level in levels:
        batch, records = level["batch"], level["records"]
        decode: list[StepRecord] = [r for r in records if r.decode and r.batch == batch]
        if not decode:
            rows.append((str(batch), "0", *["-"] * 7, str(len(records)), "-"))
            continue

        def mean(values: list[float]) -> float:
            return statistics.mean(values)

        sched = mean([r.schedule_cpu_s for r in decode])
        update = mean([r.update_cpu_s for r in decode])
        execute = mean([r.execute_s for r in decode])
        step = mean([r.step_s for r in decode])
        host = mean([r.host_s - r.step_s for r in decode])
        wall = mean([r.schedule_s + r.update_s for r in decode])
        rows.append(
            (
                str(batch),
                str(len(decode)),
                f"{sched * 1e6:.0f}",
                f"{update * 1e6:.0f}",
                f"{execute * 1e3:.2f}",
                f"{step * 1e3:.2f}",
                f"{(sched + update) / step:.1%}",
                f"{wall * 1e6:.0f}",
                f"{host * 1e6:.0f}",
                str(len(records)),
                f"{batch / step:.0f}",
            )
        )
    table(header, rows)


# ---- main ----------------------------------------------------------------------------------------
def int_list(text: str) -> list[int]:
    values = [int(x) for x in text.split(",") if x.strip()]
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers like 16,64, got {text!r}")
    return values


def share_list(text: str) -> list[float]:
    values = [float(x) for x in text.split(",") if x.strip()]
    if len(values) != 3 or not all(0 < v <= 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected three shares in (0, 1], got {text!r}")
    return values


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument(
        "--size",
        default="7b",
        choices=["7b", "tiny"],
        help="7b: Qwen2.5-Omni-7B and Qwen2.5-0.5B layouts; tiny: the test layouts (CPU smoke)",
    )
    p.add_argument("--requests", type=int_list, default=[16, 64], help="omni levels: N at once")
    p.add_argument("--single", type=int, default=3, help="omni requests one by one (0: none)")
    p.add_argument("--warmup", type=int, default=2, help="omni warm-up requests at once")
    p.add_argument("--hf-requests", type=int, default=3, help="transformers requests (+1 warm-up)")
    p.add_argument("--prompt-tokens", type=int, default=200)
    p.add_argument("--text-tokens", type=int, default=64, help="thinker tokens (ignore_eos)")
    p.add_argument("--codec-tokens", type=int, default=256, help="talker codes (~5 s of speech)")
    p.add_argument(
        "--max-num-seqs", type=int, default=64, help="thinker and talker engine.max_num_seqs"
    )
    p.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=4096,
        help="thinker and talker (prefill chunk)",
    )
    p.add_argument("--t2w-batch", type=int, help="token2wav max_num_seqs (default: the config's)")
    p.add_argument(
        "--gpu-mem",
        type=share_list,
        default=[0.45, 0.15, 0.1],
        help="gpu_memory_utilization of thinker,talker,token2wav (the decoder takes the first)",
    )
    p.add_argument("--prefix-tokens", type=int, default=4096)
    p.add_argument("--suffix-tokens", type=int, default=32)
    p.add_argument("--prefix-requests", type=int, default=5)
    p.add_argument(
        "--llm-batched-tokens", type=int, default=8192, help="decoder max_num_batched_tokens"
    )
    p.add_argument("--decode-batch", type=int_list, default=[16, 64])
    p.add_argument("--decode-tokens", type=int, default=128)
    p.add_argument("--decode-prompt-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    p.add_argument("--seed", type=int, default=0, help="checkpoint weights seed")
    p.add_argument(
        "--skip",
        action="append",
        default=[],
        choices=["hf", "omni", "prefix", "steps"],
        help="leave a part out (repeatable)",
    )
    args = p.parse_args(argv)
    for name in ("prompt_tokens", "text_tokens", "codec_tokens", "prefix_requests"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.text_tokens < 2:
        p.error("--text-tokens must be >= 2 (the talker starts from the thinker's second token)")
    args.decoder_layout = "0.5b" if args.size == "7b" else "tiny"
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit(
            f"CUDA is not available (torch {torch.__version__}, torch.cuda.is_available() is "
            "False): run this on a GPU machine, or pass --device cpu (with --size tiny for a "
            "quick smoke test)"
        )
    if args.threads:
        torch.set_num_threads(args.threads)
    print("# GPU benchmark: Qwen2.5-Omni (omni vs transformers) and a plain decoder")
    print(device_line(args.device), flush=True)
    start = time.perf_counter()
    failed: list[str] = []

    def attempt(part: str, fn: Callable[[], T]) -> T | None:
        """Run one part; a failure is printed and the other parts still run (a short device
        session keeps what did work)."""
        try:
            return fn()
        except Exception:
            traceback.print_exc()
            print(f"\n!! part {part!r} failed (traceback above); going on with the others")
            failed.append(part)
            return None
        finally:
            release(args.device)

    from transformers import AutoTokenizer

    if not {"hf", "omni"} <= set(args.skip):
        omni_dir = prepare(
            f"Qwen2.5-Omni checkpoint ({args.size} layout, random weights)",
            lambda: omni_checkpoint(args.size, args.device, args.seed),
        )
        tokenizer = AutoTokenizer.from_pretrained(omni_dir)
        hf = ours = None
        if "hf" not in args.skip:
            hf = attempt("hf", lambda: hf_section(omni_dir, tokenizer, args))
        if "omni" not in args.skip:
            ours = attempt("omni", lambda: asyncio.run(omni_section(omni_dir, tokenizer, args)))
        if hf is not None or ours is not None:
            report_omni(hf, ours, args)

    if not {"prefix", "steps"} <= set(args.skip):
        decoder_dir = prepare(
            f"\ndecoder checkpoint ({args.decoder_layout} layout, random weights)",
            lambda: decoder_checkpoint(args.decoder_layout, args.device, args.seed),
        )
        tokenizer = AutoTokenizer.from_pretrained(decoder_dir)
        if "prefix" not in args.skip:

            def both() -> dict[bool, tuple[list[dict], float | None]]:
                return {
                    caching: asyncio.run(prefix_pass(decoder_dir, tokenizer, args, caching))
                    for caching in (True, False)
                }

            prefix = attempt("prefix", both)
            if prefix is not None:
                report_prefix(prefix, args)
        if "steps" not in args.skip:
            steps = attempt(
                "steps", lambda: asyncio.run(steps_section(decoder_dir, tokenizer, args))
            )
            if steps is not None:
                report_steps(steps, args)
    print(f"\ntotal {time.perf_counter() - start:.0f} s")
    if failed:
        raise SystemExit(f"parts that failed: {', '.join(failed)}")


def prepare(label: str, build: Callable[[], Path]) -> str:
    """Build (the first time) or find a cached checkpoint; print where, its size, how long."""
    t0 = time.perf_counter()
    path = build()
    params = count_parameters(path)
    took = time.perf_counter() - t0
    print(f"{label}: {path} ({params / 1e6:,.1f} M parameters, ready in {took:.1f} s)", flush=True)
    return str(path)


if __name__ == "__main__":
    main()
