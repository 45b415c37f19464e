"""Shared parts of bench/omni_pipeline.py and its parts (omni_prefix.py, omni_streaming.py):
its prompt material, building requests and the Omni with our stream loop, the transformers
side of the comparison (one full `generate` per request, observed from the inside, run in a
child process), CPU accounting, table printing and the checkpoint and header line of a run."""

from __future__ import annotations

import math
import multiprocessing
import os
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import numpy as np
import torch
from PIL import Image

from omni import Omni, SamplingParams
from tools.make_tiny_checkpoint import count_parameters, ensure_checkpoint
from tools.omni_preprocess import OmniPreprocessor

CODEC_EOS = (8292, 8294)  # codec pad / codec end: where transformers' talker generate stops
SEED = 0  # DiT noise seed, the same on both sides
IMAGE_SLOT = "<|vision_bos|><|IMAGE|><|vision_eos|>"

SUBJECTS = [
    "the weather",
    "a lighthouse",
    "the ocean tides",
    "a city at night",
    "mountain trails",
    "a quiet library",
    "old trains",
    "a busy market",
    "the northern lights",
    "desert dunes",
    "a coral reef",
    "autumn leaves",
    "a jazz club",
    "a snowy village",
    "a river delta",
    "a space station",
    "an orchard",
    "a violin workshop",
    "a tea garden",
    "a harbour crane",
]
QUESTIONS = [
    "Who wrote the section on block hashing?",
    "How many blocks does the pool keep free?",
    "Which stage reads the hidden states?",
    "What happens when a hash collides?",
    "Why is the last token always recomputed?",
    "Where does the output cache live?",
    "What evicts blocks first?",
    "Which ids stop the talker?",
]
SYSTEM = (
    "You are Qwen, a virtual human developed by the Qwen Team, Alibaba Group, capable of "
    "perceiving auditory and visual inputs, as well as generating text and speech."
)
SENTENCES = [
    "Prefix caching keeps the key and value blocks of every prompt a stage has seen.",
    "Each block is indexed by a hash of its tokens chained with the hash of the block before it.",
    "A new request looks up its longest cached prefix and computes only the rest.",
    "In a multi-stage pipeline each stage also keeps its per-token outputs beside the blocks.",
    "A cached prefix returns the hidden states the next stage needs without running the model.",
    "The block pool evicts the least recently used blocks, tails of sequences first.",
    "Hits are checked against the stored tokens, so a hash collision can only cause a miss.",
    "The talker turns the thinker's hidden states into codec tokens for the vocoder.",
]


def chat(text: str, image: bool) -> str:
    """One user turn in Qwen's chat format, the image slot first (what both sides are given)."""
    slot = IMAGE_SLOT if image else ""
    return f"<|im_start|>user\n{slot}{text}<|im_end|>\n<|im_start|>assistant\n"


def test_image(seed: int) -> Image.Image:
    pixels = np.random.default_rng(seed).integers(0, 256, (84, 112, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def mixed_requests(n: int, offset: int = 0) -> list[tuple[str, list[Image.Image]]]:
    """n distinct (chat text, images): even indices image + text, odd indices text only."""
    out = []
    for i in range(offset, offset + n):
        subject = SUBJECTS[i % len(SUBJECTS)]
        image = i % 2 == 0
        what = "this picture" if image else subject
        text = f"Request {i}: describe {what} in a few words, mentioning {subject}."
        out.append((chat(text, image), [test_image(1000 + i)] if image else []))
    return out


def stage_params(args, thinker_tokens: int | None = None) -> list[SamplingParams]:
    return [
        SamplingParams(max_tokens=thinker_tokens or args.thinker_tokens, ignore_eos=True),
        SamplingParams(max_tokens=args.talker_tokens, stop_token_ids=CODEC_EOS),
        SamplingParams(max_tokens=1, seed=SEED),
    ]


def make_omni(model_dir: str, args, caching: bool = True, **extra) -> Omni:
    processor = "thinker_to_talker" + ("_unmasked" if args.talker_mode == "unmasked" else "")
    overrides: dict[str, object] = {"stages.talker.input_processor": processor}
    for stage in ("thinker", "talker"):
        overrides[f"stages.{stage}.engine.enable_prefix_caching"] = caching
    return Omni(model=model_dir, runtime={"backend": args.backend}, **overrides, **extra)


def _index(request_id: str) -> int:
    """Request ids are req-N, assigned in prompt order within a call."""
    return int(request_id.rsplit("-", 1)[-1])


def run_ours(omni: Omni, requests, params) -> dict:
    prompts = [{"prompt": text, "images": images} for text, images in requests]
    results: dict[str, dict] = {}
    first_audio = None
    last: dict[str, float] = {}
    start = time.perf_counter()
    for r in omni.stream(prompts, params, stream_audio=True):
        if r.error:
            raise SystemExit(f"{r.request_id} failed in {r.stage}: {r.error}")
        results.setdefault(r.request_id, {})[r.stage] = r
        last[r.stage] = time.perf_counter() - start
        if r.stage == "token2wav" and first_audio is None:
            first_audio = time.perf_counter() - start
    wall = time.perf_counter() - start
    ordered = [results[request_id] for request_id in sorted(results, key=_index)]
    return {
        "wall": wall,
        "ttfa": first_audio,
        "last": last,
        "thinker": [s["thinker"].token_ids for s in ordered],
        "codes": [s["talker"].token_ids for s in ordered],
        "audio_s": sum(s["token2wav"].audio.numel() / s["token2wav"].sample_rate for s in ordered),
    }


def load_hf(model_dir: str):
    from transformers import Qwen2_5OmniForConditionalGeneration

    model = Qwen2_5OmniForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32)
    model.thinker.generation_config.eos_token_id = None  # exactly --thinker-tokens, as ours
    return model.eval()


def hf_generate(model, pre: OmniPreprocessor, text: str, images, args) -> tuple[list, list, float]:
    """One full generate: (thinker tokens, talker codes up to the first EOS, audio seconds)."""
    seen = {}
    original = model.talker.generate

    def talker_generate(*a, **kw):
        out = original(*a, **kw)
        seen["codes"] = out[0, kw["input_ids"].shape[1] :].tolist()
        return out

    kwargs = pre.generate_kwargs(pre(text, images=images))
    kwargs.pop("attention_mask", None)  # a single unpadded request, as the tests run it
    prompt_len = kwargs["input_ids"].shape[1]
    model.talker.generate = talker_generate
    try:
        torch.manual_seed(SEED)
        with torch.inference_mode():
            sequences, wav = model.generate(
                **kwargs,
                thinker_max_new_tokens=args.thinker_tokens,
                talker_max_new_tokens=args.talker_tokens,
                talker_do_sample=False,
            )
    finally:
        del model.talker.generate
    codes = seen.get("codes", [])
    for i, c in enumerate(codes):
        if c in CODEC_EOS:
            codes = codes[: i + 1]
            break
    return sequences[0, prompt_len:].tolist(), codes, wav.numel() / 24000


def run_hf(model, pre, requests, args) -> dict:
    thinker, codes, audio_s, first = [], [], 0.0, None
    start = time.perf_counter()
    for text, images in requests:
        t, c, a = hf_generate(model, pre, text, images, args)
        thinker.append(t)
        codes.append(c)
        audio_s += a
        if first is None:
            first = time.perf_counter() - start
    wall = time.perf_counter() - start
    return {"wall": wall, "ttfa": first, "thinker": thinker, "codes": codes, "audio_s": audio_s}


def pct(values: list[float], q: float) -> float:
    """The q-th percentile, linearly interpolated (with few values p99 is about the max)."""
    return float(np.percentile(values, q))


def in_child(fn: Callable[..., Any], *args: Any) -> Any:
    """fn(*args) in a fresh (spawned) process. The transformers side runs there, so that its
    torch work never gives this process's main thread an OpenMP thread team: with one, the
    team of the thread that steps our stages (omni/backends/local.py) spins less and every
    parallel region pays a wake-up (a vocoder pass about 1.6x slower on 2 cores), which would
    slow every later part of the benchmark."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(fn, *args).result()


def hf_throughput(model_dir: str, warm: tuple[str, list], requests: list, args) -> dict:
    """Part 1's transformers side (in_child): one warm-up generate, then run_hf."""
    torch.set_num_threads(args.threads)
    model = load_hf(model_dir)
    pre = OmniPreprocessor(model_dir)
    hf_generate(model, pre, *warm, args)
    return run_hf(model, pre, requests, args)


def hf_each(model_dir: str, requests: list, args) -> dict:
    """Part 3's transformers side (in_child): generate one request after another, after a
    warm-up on requests[0]; its first audio is the whole call (the waveform comes at the end).
    {"rows": one dict per timed request, "others": other_cores meanwhile}."""
    torch.set_num_threads(args.threads)
    model = load_hf(model_dir)
    pre = OmniPreprocessor(model_dir)
    text, images = requests[0]
    hf_generate(model, pre, text, images, args)
    rows = []
    clock = cpu_clock()
    for text, images in requests[1:]:
        start = time.perf_counter()
        _, codes, seconds = hf_generate(model, pre, text, images, args)
        took = time.perf_counter() - start
        rtf = took / seconds if seconds else float("nan")
        rows.append(
            {"ttfa": took, "e2e": took, "rtf": rtf, "audio_s": seconds, "codes": len(codes)}
        )
    return {"rows": rows, "others": other_cores(clock, cpu_clock())}


def cpu_clock() -> tuple[float, float, float]:
    """(wall s, CPU s the whole machine was busy, CPU s of this process and its finished
    children) now; other_cores of two of these says how much of the machine other processes
    took in between."""
    busy = float("nan")
    try:
        with open("/proc/stat") as f:
            fields = [float(x) for x in f.readline().split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)  # idle + iowait
        busy = (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")  # without guest time
    except (OSError, ValueError, IndexError):
        pass  # not Linux: unknown
    own = os.times()  # with the children waited for (in_child's processes)
    return (
        time.perf_counter(),
        busy,
        own.user + own.system + own.children_user + own.children_system,
    )


def other_cores(start: tuple[float, float, float], end: tuple[float, float, float]) -> float:
    """Cores' worth of CPU that other processes used between two cpu_clock() readings (a
    timing taken while this is well above 0 was slowed by them; nan where unknown). Under
    --backend ray the stage actors are such other processes."""
    wall, busy = end[0] - start[0], end[1] - start[1]
    if not wall > 0 or math.isnan(busy):
        return float("nan")
    return max(0.0, busy - (end[2] - start[2])) / wall


def hit(pair: tuple[int, int]) -> str:
    cached, total = pair
    return f"{cached}/{total} ({cached / total:.0%})"


def prepare_model(args) -> tuple[str, str]:
    """Set torch's threads (--threads) and find the checkpoint (--model, or the cached one of
    --size); return its directory and the start of the run's description line."""
    torch.set_num_threads(args.threads)
    family = getattr(args, "family", "qwen2_5_omni")
    model_dir = args.model or str(ensure_checkpoint(family, args.size))
    params = count_parameters(model_dir)
    size = f"{args.size if args.model is None else model_dir} ({params / 1e6:.1f} M parameters)"
    threads = f"torch threads {args.threads} (of {os.cpu_count()} CPUs)"
    return model_dir, f"model {size}, {threads}, backend {args.backend}, float32"
