"""The 3-stage Qwen2.5-Omni pipeline (thinker -> talker -> token2wav) against transformers.

1. Throughput: N mixed requests (half image + text, half text only; all distinct) submitted at
   once to our pipeline (`Omni.stream`) versus transformers' full
   `Qwen2_5OmniForConditionalGeneration.generate` run request by request, on the same weights and
   inputs with the same budgets (thinker exactly --thinker-tokens, greedy talker up to
   --talker-tokens stopping at the codec EOS ids, one DiT pass). Requests/s, generated thinker
   tokens/s and time to first audio (ours: submit -> first token2wav result; transformers: the
   first request's `generate` returning).
2. Shared long prefix: a system prompt plus a long document, then different short questions, one
   request after another, prefix caching on versus off: thinker time to first token (a pass with
   thinker max_tokens=1, leaving the stream at the thinker result), thinker finish and talker
   start (= thinker result arrival), talker and audio arrival, and the hit rates
   (num_cached_tokens / num_prompt_tokens) of thinker and talker. Each pass uses its own
   document, so its first request is always a cold miss.

Timings only: nothing is asserted. The checkpoint has random weights, so text and audio are noise.

    .venv/bin/python bench/omni_pipeline.py [--size bench|tiny] [--backend local|ray]
        [--requests 16] [--thinker-tokens 16] [--talker-tokens 48] [--threads 2]
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
import statistics  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from omni_bench_support import (  # noqa: E402
    CODEC_EOS,
    QUESTIONS,
    SEED,
    SENTENCES,
    SUBJECTS,
    SYSTEM,
    _param_shapes,
    hf_generate,
    hit,
    load_hf,
    run_hf,
    table,
)
from PIL import Image  # noqa: E402

from omni import Omni, SamplingParams  # noqa: E402
from tools.make_tiny_checkpoint import ensure_checkpoint  # noqa: E402
from tools.omni_preprocess import OmniPreprocessor  # noqa: E402

IMAGE_SLOT = "<|vision_bos|><|IMAGE|><|vision_eos|>"


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


def make_omni(model_dir: str, args, caching: bool = True) -> Omni:
    processor = "thinker_to_talker" + ("_unmasked" if args.talker_mode == "unmasked" else "")
    overrides = {"stages.talker.input_processor": processor}
    for stage in ("thinker", "talker"):
        overrides[f"stages.{stage}.engine.enable_prefix_caching"] = caching
    return Omni(model=model_dir, runtime={"backend": args.backend}, **overrides)


def _index(request_id: str) -> int:
    """Request ids are req-N, assigned in prompt order within a call."""
    return int(request_id.rsplit("-", 1)[-1])


# ---- 1. throughput -------------------------------------------------------------------------------
def run_ours(omni: Omni, requests, params) -> dict:
    prompts = [{"prompt": text, "images": images} for text, images in requests]
    results: dict[str, dict] = {}
    first_audio = None
    last: dict[str, float] = {}
    start = time.perf_counter()
    for r in omni.stream(prompts, params):
        if r.error:
            raise SystemExit(f"{r.request_id} failed in {r.stage}: {r.error}")
        results.setdefault(r.request_id, {})[r.stage] = r
        last[r.stage] = time.perf_counter() - start
        if r.stage == "token2wav" and first_audio is None:
            first_audio = time.perf_counter() - start
    wall = time.perf_counter() - start
    ordered = [results[rid] for rid in sorted(results, key=_index)]
    return {
        "wall": wall,
        "ttfa": first_audio,
        "last": last,
        "thinker": [s["thinker"].token_ids for s in ordered],
        "codes": [s["talker"].token_ids for s in ordered],
        "audio_s": sum(s["token2wav"].audio.numel() / s["token2wav"].sample_rate for s in ordered),
    }


def throughput_section(model_dir: str, args) -> None:
    n = args.requests
    requests = mixed_requests(n)
    warm = mixed_requests(2, offset=n)  # distinct prompts and images: nothing cached for later
    params = stage_params(args)

    t0 = time.perf_counter()
    with make_omni(model_dir, args) as omni:
        startup = time.perf_counter() - t0
        run_ours(omni, warm, params)
        ours = run_ours(omni, requests, params)
    model = load_hf(model_dir)
    pre = OmniPreprocessor(model_dir)
    hf_generate(model, pre, *warm[0], args)
    hf = run_hf(model, pre, requests, args)
    del model

    print(f"\n## 1. Throughput: {n} requests ({(n + 1) // 2} image + text, {n // 2} text only)")
    print(
        f"thinker {args.thinker_tokens} tokens (ignore_eos), talker <= {args.talker_tokens} codes "
        f"(greedy, stop {CODEC_EOS}), token2wav 1 pass (seed {SEED}); ours: all {n} submitted "
        f"at once via Omni.stream (stage startup {startup:.1f} s, not timed); transformers: "
        "generate() request by request; both warmed up once"
    )
    rows = []
    for name, r in (("omni (ours)", ours), ("transformers", hf)):
        tokens = sum(len(t) for t in r["thinker"])
        codes = sum(len(c) for c in r["codes"])
        rows.append(
            (
                name,
                f"{r['wall']:.2f}",
                f"{n / r['wall']:.2f}",
                f"{tokens / r['wall']:.1f}",
                f"{r['ttfa']:.2f}",
                str(tokens),
                str(codes),
                f"{r['audio_s']:.1f}",
            )
        )
    header = (
        "",
        "wall s",
        "req/s",
        "thinker tok/s",
        "first audio s",
        "thinker toks",
        "talker codes",
        "audio s",
    )
    table(header, rows)
    same_t = sum(a == b for a, b in zip(ours["thinker"], hf["thinker"], strict=True))
    same_c = sum(a == b for a, b in zip(ours["codes"], hf["codes"], strict=True))
    print(
        f"\nratios: throughput {hf['wall'] / ours['wall']:.2f}x (ours / transformers req/s), "
        f"time to first audio {hf['ttfa'] / ours['ttfa']:.2f}x (transformers / ours; "
        "> 1 = ours sooner)"
    )
    print(f"same tokens as transformers: thinker {same_t}/{n}, talker codes {same_c}/{n}")
    done = ", ".join(f"{stage} {t:.2f} s" for stage, t in ours["last"].items())
    print(f"ours, each stage's last result after submit: {done}")


# ---- 2. shared long prefix -----------------------------------------------------------------------
def document(tokenizer, target_tokens: int, seed: int) -> str:
    """Sentences in a seeded order until the text has at least target_tokens tokens."""
    rng = np.random.default_rng(seed)
    parts: list[str] = [f"Document {seed}."]
    while len(tokenizer.encode(" ".join(parts), add_special_tokens=False)) < target_tokens:
        parts.extend(SENTENCES[i] for i in rng.permutation(len(SENTENCES)))
    return " ".join(parts)


def long_prompt(doc: str, question: str) -> str:
    return (
        f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{doc}\n\n"
        f"Question: {question}<|im_end|>\n<|im_start|>assistant\n"
    )


def ttft_pass(omni: Omni, prompts: list[str], args) -> list[dict]:
    """Thinker max_tokens=1; the stream is left at the thinker result (the rest is aborted)."""
    rows = []
    for prompt in prompts:
        start = time.perf_counter()
        stream = omni.stream([prompt], stage_params(args, thinker_tokens=1))
        for r in stream:
            if r.stage == "thinker":
                wall = time.perf_counter() - start
                rows.append({"wall": wall, "engine": r.timings.get("latency_s", float("nan"))})
                break
        stream.close()
    return rows


def full_pass(omni: Omni, prompts: list[str], args) -> list[dict]:
    rows = []
    for prompt in prompts:
        row: dict = {}
        start = time.perf_counter()
        for r in omni.stream([prompt], stage_params(args)):
            if r.error:
                raise SystemExit(f"{r.request_id} failed in {r.stage}: {r.error}")
            row[r.stage] = time.perf_counter() - start
            if r.stage in ("thinker", "talker"):
                row[r.stage + "_hit"] = (r.num_cached_tokens, r.num_prompt_tokens)
        rows.append(row)
    return rows


def prefix_section(model_dir: str, args) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    questions = [QUESTIONS[i % len(QUESTIONS)] for i in range(args.questions)]
    ttft_prompts = [long_prompt(document(tok, args.doc_tokens, 1), q) for q in questions]
    full_prompts = [long_prompt(document(tok, args.doc_tokens, 2), q) for q in questions]
    plen = len(tok.encode(full_prompts[0], add_special_tokens=False))
    results = {}
    for caching in (True, False):
        with make_omni(model_dir, args, caching) as omni:
            run_ours(omni, mixed_requests(1, offset=args.requests + 2), stage_params(args))
            results[caching] = (
                ttft_pass(omni, ttft_prompts, args),
                full_pass(omni, full_prompts, args),
            )

    print(f"\n## 2. Shared long prefix: system prompt + document, {args.questions} questions")
    print(
        f"prompts of ~{plen} tokens, sent one after another (each pass has its own document, "
        f"so request 1 is cold); thinker {args.thinker_tokens} tokens, talker <= "
        f"{args.talker_tokens} codes. TTFT: thinker max_tokens=1, submit -> thinker result "
        "(engine latency_s in brackets). talker start = thinker result arrival."
    )
    header = (
        "req",
        "caching",
        "TTFT s",
        "talker start s",
        "talker done s",
        "audio s",
        "thinker hit",
        "talker hit",
    )
    rows = []
    for i in range(args.questions):
        for caching in (False, True):
            ttft, full = results[caching][0][i], results[caching][1][i]
            rows.append(
                (
                    str(i + 1),
                    "on" if caching else "off",
                    f"{ttft['wall']:.3f} ({ttft['engine']:.3f})",
                    f"{full['thinker']:.3f}",
                    f"{full['talker']:.3f}",
                    f"{full['token2wav']:.3f}",
                    hit(full["thinker_hit"]),
                    hit(full["talker_hit"]),
                )
            )
    table(header, rows)

    def mean(caching: bool, key: str, part: int) -> float:
        return statistics.mean(r[key] for r in results[caching][part][1:])

    if args.questions > 1:
        print(f"\nratios over requests 2..{args.questions} (off / on, > 1 = caching faster):")
        for label, key, part in (
            ("thinker TTFT", "wall", 0),
            ("talker start", "thinker", 1),
            ("talker done", "talker", 1),
            ("first audio", "token2wav", 1),
        ):
            off, on = mean(False, key, part), mean(True, key, part)
            print(f"  {label:<13} {off:.3f} s -> {on:.3f} s: {off / on:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="Qwen2.5-Omni checkpoint dir (default: built --size)")
    parser.add_argument("--size", default="bench", choices=["bench", "tiny"])
    parser.add_argument("--backend", default="local", choices=["local", "ray"])
    parser.add_argument("--threads", type=int, default=2, help="torch threads in this process")
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--thinker-tokens", type=int, default=16)
    parser.add_argument("--talker-tokens", type=int, default=48)
    parser.add_argument("--questions", type=int, default=4)
    parser.add_argument("--doc-tokens", type=int, default=1000)
    parser.add_argument(
        "--talker-mode",
        default="unmasked",
        choices=["unmasked", "masked"],
        help="talker input path: unmasked = what transformers' single-request generate runs",
    )
    parser.add_argument("--skip", choices=["throughput", "prefix"], help="leave one part out")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model_dir = args.model or str(ensure_checkpoint("qwen2_5_omni", args.size))
    params = sum(int(np.prod(v)) for v in _param_shapes(model_dir))
    size = f"{args.size if args.model is None else model_dir} ({params / 1e6:.1f} M parameters)"
    print("# Qwen2.5-Omni pipeline benchmark (random weights)")
    print(
        f"model {size}, torch threads {args.threads} (of {os.cpu_count()} CPUs), backend "
        f"{args.backend}, float32, talker input path {args.talker_mode}, torch {torch.__version__}"
    )
    start = time.perf_counter()
    if args.skip != "throughput":
        throughput_section(model_dir, args)
    if args.skip != "prefix":
        prefix_section(model_dir, args)
    print(f"\ntotal {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
