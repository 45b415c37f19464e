"""Parts 1 and 2 of bench/gpu.py on the omni checkpoint (Qwen2.5-Omni or Qwen3-Omni, --family):
transformers' generate one request after another (hf_section), and our pipeline through
AsyncOmni, one by one and N at once (omni_section)."""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import time
import warnings
from typing import Any

import torch
from gpu_timing import allocated_gib, peak_gib, release, reset_peak, sync
from gpu_workload import SEED, blocks_for, chat_ids, engine_overrides, omni_params
from playback import Playback
from step_trace import StepTrace

from omni import AsyncOmni, SamplingParams

SAMPLE_RATE = 24000  # transformers' waveforms, both families


# ---- 1. transformers -----------------------------------------------------------------------------
def load_hf(model_dir: str, args: argparse.Namespace) -> Any:
    import transformers

    cls = getattr(transformers, args.fam.hf_class)
    # Qwen3-Omni's generate applies its talker's repetition penalty to the new codes only, as
    # it warns each time; omni does the same (stage_configs/qwen3_omni_moe.yaml).
    warnings.filterwarnings("ignore", message="Passing `repetition_penalty` with `inputs_embeds`")
    if args.device == "cuda":
        model = cls.from_pretrained(model_dir, dtype=torch.bfloat16, device_map="cuda")
    else:
        model = cls.from_pretrained(model_dir, dtype=torch.float32)
    model.thinker.generation_config.eos_token_id = None  # exactly --text-tokens, as ours
    return model.eval()


def generate_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """Greedy budgets of one generate; Qwen3-Omni's thinker EOS is an argument of generate."""
    kwargs: dict[str, Any] = dict(
        thinker_max_new_tokens=args.text_tokens,
        talker_max_new_tokens=args.codec_tokens,
        talker_do_sample=False,
    )
    if args.fam.name == "qwen3_omni_moe":
        kwargs.update(thinker_eos_token_id=None, thinker_do_sample=False)
    return kwargs


def count_codes(out: Any, kwargs: dict[str, Any], args: argparse.Namespace) -> int:
    """Codes one talker.generate made (Qwen3-Omni: layer-0 codes, one per frame), up to codec
    EOS."""
    if args.fam.name == "qwen3_omni_moe":  # a GenerateOutput of the new codes only
        codes, stops = out.sequences[0].tolist(), {kwargs["eos_token_id"]}
    else:
        codes, stops = out[0, kwargs["input_ids"].shape[1] :].tolist(), set(args.fam.codec_eos)
    return next((i for i, code in enumerate(codes) if code in stops), len(codes))


def hf_request(model: Any, ids: list[int], args: argparse.Namespace) -> dict[str, float]:
    """One full generate; TTFT = the thinker's second forward starting (after a device sync);
    the thinker's per-token time runs from there to the talker's start (the thinker's last
    steps), the talker's per-code time is its generate over the codes it made."""
    calls = 0
    first_token: float | None = None
    talker_span: list[float] = []
    num_codes = 0
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
        nonlocal num_codes
        sync(args.device)
        talker_span.append(time.perf_counter())
        out = talker_generate(*args_, **kwargs)
        sync(args.device)
        talker_span.append(time.perf_counter())
        num_codes = count_codes(out, kwargs, args)
        return out

    input_ids = torch.tensor([ids], device=args.device)
    model.thinker.forward, model.talker.generate = timed_forward, counted_generate
    try:
        torch.manual_seed(SEED)
        sync(args.device)
        start = time.perf_counter()
        with torch.inference_mode():
            sequences, wav = model.generate(input_ids=input_ids, **generate_kwargs(args))
        sync(args.device)
        took = time.perf_counter() - start
    finally:
        del model.thinker.forward, model.talker.generate
    audio_s = wav.numel() / SAMPLE_RATE
    ttft = (first_token - start) if first_token is not None else took
    text = sequences.shape[1] - len(ids)
    nan = float("nan")
    talker_start, talker_end = talker_span if len(talker_span) == 2 else (nan, nan)
    return {
        "ttft": ttft,
        "ttfa": took,  # the audio comes with the return of generate
        "e2e": took,
        "rtf": took / audio_s if audio_s else nan,
        "audio_s": audio_s,
        "text": text,
        "codes": num_codes,
        "thinker_s_per_token": (talker_start - start - ttft) / (text - 1) if text > 1 else nan,
        "talker_s_per_code": (talker_end - talker_start) / num_codes if num_codes else nan,
    }


def hf_section(model_dir: str, tokenizer: Any, args: argparse.Namespace) -> dict[str, Any]:
    reset_peak(args.device)
    t0 = time.perf_counter()
    model = load_hf(model_dir, args)
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
    thinker_name, talker_name, vocoder = args.fam.stages
    overrides = engine_overrides(args, args.fam.stages)
    seqs = args.max_num_seqs
    thinker_tokens = args.prompt_tokens + args.text_tokens
    talker_tokens = args.prompt_tokens + args.fam.talker_prompt_extra + args.codec_tokens
    for stage, tokens in ((thinker_name, thinker_tokens), (talker_name, talker_tokens)):
        overrides[f"stages.{stage}.engine.max_num_seqs"] = seqs
        overrides[f"stages.{stage}.engine.max_num_batched_tokens"] = args.max_num_batched_tokens
        overrides[f"stages.{stage}.engine.num_blocks"] = blocks_for(seqs, tokens)
        overrides[f"stages.{stage}.engine.max_model_len"] = max(4096, tokens + 16)
    # On a GPU a batch of chunks costs about one: no code budget short of the batch itself.
    overrides[f"stages.{vocoder}.engine.max_num_batched_tokens"] = 1 << 20
    if args.t2w_batch:
        overrides[f"stages.{vocoder}.engine.max_num_seqs"] = args.t2w_batch
    if getattr(args, "t2w_dtype", None):
        overrides[f"stages.{vocoder}.stream.dtype"] = args.t2w_dtype
    if getattr(args, "t2w_ramp", None):
        overrides[f"stages.{vocoder}.stream.ramp"] = list(args.t2w_ramp)
    if getattr(args, "ahead", False):
        for stage in (thinker_name, talker_name):
            overrides[f"stages.{stage}.engine.async_scheduling"] = True
            overrides[f"stages.{stage}.engine.cuda_graphs"] = True  # the CPU's padded steps
    return overrides


async def omni_request(engine: AsyncOmni, ids: list[int], params: list[SamplingParams]) -> dict:
    start = time.perf_counter()
    audio_stage = engine.audio_stage
    ttft = ttfa = None
    last = None
    play = Playback()
    async for out in engine.generate({"prompt_token_ids": ids}, params, stream_audio=True):
        now = time.perf_counter() - start
        thinker = out.stages.get("thinker")
        if ttft is None and thinker is not None and thinker.token_ids:
            ttft = now
        audio = out.final.audio
        if out.final.stage == audio_stage and audio is not None and audio.numel():
            ttfa = now if ttfa is None else ttfa
            play.arrived(now, audio.numel(), out.final.sample_rate or 0)
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
        "stall_s": play.stall_s,  # silence a listener hears after the first audio
        "text": len(last.stages["thinker"].token_ids),
        "codes": len(last.stages["talker"].token_ids),
    }
    # Pipeline times since the request was added, per stage: where the first audio waits.
    for name, result in last.stages.items():
        for key in ("started_s", "first_token_s", "finished_s", "first_audio_s"):
            if key in result.timings:
                row[f"{name} {key}"] = result.timings[key]
    return row


def counters(engine: AsyncOmni) -> dict[str, float]:
    # Full (generation 2) collections stop every stage for their length (gc_freeze.py): 0
    # expected with the start-up objects frozen.
    full_gcs = float(gc.get_stats()[2]["collections"])
    out: dict[str, float] = {"triton compiles": float(triton_compiles()), "full gcs": full_gcs}
    for name, stats in engine.stats().items():
        for key in ("steps", "graph_steps", "preemptions", "busy_s", "steps_launched_ahead"):
            if isinstance(stats.get(key), int | float):
                out[f"{name} {key}"] = float(stats[key])
    return out


def triton_compiles() -> int:
    """Variants of omni's Triton kernels compiled so far in this process (the local backend's
    stages): one during a level is a compile (hundreds of ms) on a live request."""
    from kernels import fused_activation, fused_norm, fused_rotary, split_kv, triton_paged_attention
    from kernels.triton_launch import num_compiled

    modules = (triton_paged_attention, fused_norm, fused_rotary, fused_activation)
    return sum(num_compiled(module._kernel) for module in modules) + num_compiled(split_kv._combine)


async def omni_level(
    engine: AsyncOmni,
    prompts: list[list[int]],
    args: argparse.Namespace,
    at_once: bool,
    trace: StepTrace | None = None,
) -> dict[str, Any]:
    """All prompts launched at once (at_once) or one after another; wall = the whole level."""
    params = omni_params(args)
    reset_peak(args.device)
    before = counters(engine)
    if trace is not None:
        trace.start()
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
        "trace": trace.take() if trace is not None else {},
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
        trace = StepTrace(engine)
        if args.single:
            prompts = [chat_ids(tokenizer, args.prompt_tokens, (1, i)) for i in range(args.single)]
            levels.append(("single", await omni_level(engine, prompts, args, False, trace)))
            print(f"  omni single: {levels[-1][1]['wall']:.2f} s", flush=True)
        for n in args.requests:
            prompts = [chat_ids(tokenizer, args.prompt_tokens, (2, n, i)) for i in range(n)]
            levels.append((str(n), await omni_level(engine, prompts, args, True, trace)))
            print(f"  omni {n} at once: {levels[-1][1]['wall']:.2f} s", flush=True)
        results["levels"] = levels
        results["config"] = {s.name: s.engine for s in engine.config.stages}
        vocoder = engine.stats().get(args.fam.stages[2], {})
        results["vocoder"] = {
            k: vocoder[k] for k in ("chunk_dtype", "cuda_graphs", "float32_retries") if k in vocoder
        }
    release(args.device)
    results["left"] = allocated_gib(args.device)
    return results
