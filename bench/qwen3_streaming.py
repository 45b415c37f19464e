"""Qwen3-Omni streaming speech against transformers' generate (bench/omni_pipeline.py --family
qwen3_omni_moe): one function of (model dir, args) that runs and prints its table.

On the bench checkpoint (tools/tiny_qwen3_omni.py "bench": random weights, the real model's 16
code groups and 1920 samples per frame), thinker exactly --speech-thinker-tokens, talker up to
--speech-talker-tokens frames, greedy, text-only distinct prompts:

- transformers: `Qwen3OmniMoeForConditionalGeneration.generate` on --hf-requests requests one at
  a time in this process (its first audio is its whole waveform);
- ours, local backend, stream_audio: C=1 (--speech-samples requests one after another) and C=16
  (16 launched at once): first audio (the first snapshot with code2wav audio, from the launch)
  and requests/s; then the joined stream vs the whole decode of the same codes (length, SNR).

Prints the issue's targets (first audio at 1 >= 5x sooner than transformers' waveform,
throughput at 16 >= 3x transformers one by one, first-audio p99 at 16 <= 3x p50 at 1) and, per
stage, its busy time per request: the bottleneck, and the ceiling it puts on throughput.
Timings only: nothing is asserted.
"""

from __future__ import annotations

import asyncio
import math
import time

import numpy as np
import torch

from omni import Omni
from omni.core.sampling_params import SamplingParams

STAGES = ("thinker", "talker", "code2wav")


def prompts(n: int, offset: int = 0) -> list[dict]:
    return [{"prompt": f"Request {i}: tell me about the number {i} in a few words."}
            for i in range(offset, offset + n)]  # fmt: skip


def params(args) -> list[SamplingParams]:
    return [
        SamplingParams(max_tokens=args.speech_thinker_tokens, ignore_eos=True),
        SamplingParams(max_tokens=args.speech_talker_tokens),
        SamplingParams(max_tokens=1),
    ]


def transformers_side(model_dir: str, args) -> dict:
    """transformers' generate one request at a time: seconds per request (to its waveform)."""
    from transformers import Qwen3OmniMoeForConditionalGeneration

    from stages.qwen3_omni_moe.prompt_processor import Qwen3OmniPromptProcessor

    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    processor = Qwen3OmniPromptProcessor(model_dir)
    times, seconds = [], []
    for i, prompt in enumerate(prompts(args.hf_requests + 1, offset=1000)):
        ids = processor(f"hf-{i}", prompt).prompt_token_ids
        start = time.perf_counter()
        with torch.inference_mode():
            _, wav = model.generate(
                input_ids=torch.tensor([ids]), thinker_max_new_tokens=args.speech_thinker_tokens,
                thinker_do_sample=False, talker_max_new_tokens=args.speech_talker_tokens,
                talker_do_sample=False, speaker="Ethan",
            )  # fmt: skip
        if i:  # the first is a warm-up
            times.append(time.perf_counter() - start)
            seconds.append(wav.numel() / 24000)
    del model
    return {"s_per_request": float(np.median(times)), "audio_s": float(np.mean(seconds))}


async def one(omni: Omni, prompt: dict, stage_params, t0: float) -> dict:
    first = None
    async for out in omni.async_omni.generate(prompt, stage_params, stream_audio=True):
        if first is None and out.final.stage == "code2wav" and out.final.audio is not None:
            first = time.perf_counter() - t0
        last = out
    if last.error is not None:
        raise SystemExit(f"request failed: {last.error}")
    audio = last.final.audio
    return {"first_audio": first if first is not None else time.perf_counter() - t0,
            "end": time.perf_counter() - t0, "audio_s": audio.numel() / 24000}  # fmt: skip


def level(omni: Omni, args, concurrency: int, offset: int) -> dict:
    stage_params = params(args)
    batches = (prompts(1, offset + i) for i in range(args.speech_samples)) if concurrency == 1 \
        else [prompts(concurrency, offset)]  # fmt: skip
    got, start = [], time.perf_counter()
    for batch in batches:

        async def launch(batch=batch) -> list[dict]:
            t0 = time.perf_counter()
            return await asyncio.gather(*(one(omni, p, stage_params, t0) for p in batch))

        got += omni._call(launch())
    wall = time.perf_counter() - start
    first = np.array([g["first_audio"] for g in got])
    return {"n": len(got), "wall": wall, "req_s": len(got) / wall,
            "p50": float(np.percentile(first, 50)), "p99": float(np.percentile(first, 99)),
            "audio_s": float(np.mean([g["audio_s"] for g in got]))}  # fmt: skip


def stage_busy(omni: Omni) -> dict[str, float]:
    """Seconds each stage spent stepping so far (ar stages: their runner's forward time)."""
    stats = omni.stats()
    out = {}
    for stage in STAGES:
        s = stats[stage]
        out[stage] = float(s.get("busy_s") or s.get("step_s") or s.get("forward_s") or 0.0)
    return out


def joined_vs_whole(omni: Omni, args) -> tuple[int, int, float]:
    """The same prompt streamed and whole (greedy: the same codes): lengths and SNR dB."""
    prompt = prompts(1, offset=500)
    (whole,) = omni.generate(prompt, params(args), use_tqdm=False)
    (stream,) = omni.generate(prompt, params(args), use_tqdm=False, stream_audio=True)
    a, b = whole.final.audio, stream.final.audio
    noise = float((a - b).pow(2).sum()) if a.shape == b.shape else math.nan
    snr = math.inf if noise == 0 else 10 * math.log10(float(a.pow(2).sum()) / noise)
    return len(a), len(b), snr


def qwen3_section(model_dir: str, args) -> None:
    torch.set_num_threads(args.threads)
    hf = transformers_side(model_dir, args)
    overrides = {f"stages.{s}.engine.device": "cpu" for s in STAGES}
    if args.chunk_size:
        overrides["stages.code2wav.stream.chunk_size"] = args.chunk_size
    with Omni(model=model_dir, runtime={"backend": args.backend}, **overrides) as omni:
        level(omni, args, 1, offset=900)  # warm-up
        before = stage_busy(omni)
        one_ = level(omni, args, 1, offset=0)
        mid = stage_busy(omni)
        sixteen = level(omni, args, 16, offset=100)
        after = stage_busy(omni)
        lengths = joined_vs_whole(omni, args)
        vocoder = omni.stats()["code2wav"]
    t_hf = hf["s_per_request"]
    print(f"\nQwen3-Omni streaming, bench checkpoint, {args.threads} threads, backend "
          f"{args.backend}: thinker {args.speech_thinker_tokens} tokens, talker up to "
          f"{args.speech_talker_tokens} frames ({one_['audio_s']:.2f} s of audio; "
          f"transformers {hf['audio_s']:.2f} s)")  # fmt: skip
    print("| C | first audio p50 / p99 s | req/s | vs transformers |\n|---|---|---|---|")
    print(f"| transformers, one by one | {t_hf:.2f} (its waveform) | {1 / t_hf:.2f} | 1x |")
    for c, r in ((1, one_), (16, sixteen)):
        print(f"| {c} | {r['p50']:.2f} / {r['p99']:.2f} | {r['req_s']:.2f} | "
              f"{r['req_s'] * t_hf:.2f}x |")  # fmt: skip
    ratios = [
        ("first audio at 1 vs transformers' waveform", t_hf / one_["p50"], ">= 5x sooner", 5.0),
        ("throughput at 16 vs transformers one by one", sixteen["req_s"] * t_hf, ">= 3x", 3.0),
    ]
    for name, value, target, bound in ratios:
        print(f"{name}: {value:.2f}x (target {target}) {'met' if value >= bound else 'NOT met'}")
    spread = sixteen["p99"] / one_["p50"]
    print(f"first-audio p99 at 16 / p50 at 1: {spread:.2f}x (target <= 3x) "
          f"{'met' if spread <= 3 else 'NOT met'}")  # fmt: skip
    whole_len, stream_len, snr = lengths
    print(f"joined stream vs whole decode: {stream_len} vs {whole_len} samples "
          f"({'identical length' if stream_len == whole_len else 'LENGTHS DIFFER'}), "
          f"SNR {snr:.1f} dB")  # fmt: skip
    print(f"code2wav: {vocoder['chunks_per_request']:.1f} chunks per request, RTF "
          f"{vocoder['rtf']:.3f}")  # fmt: skip
    for name, (a, b, n) in (("C=1", (before, mid, one_["n"])), ("C=16", (mid, after, 16))):
        per = {s: (b[s] - a[s]) / n for s in STAGES}
        slowest = max(per, key=lambda s: per[s])
        print(f"{name} busy s per request: " + ", ".join(f"{s} {v:.3f}" for s, v in per.items())
              + f"; bottleneck {slowest}: ceiling {1 / per[slowest]:.2f} req/s = "
              f"{t_hf / per[slowest]:.2f}x transformers")  # fmt: skip
