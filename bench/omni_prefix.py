"""Part 2 of bench/omni_pipeline.py, shared long prefix: a system prompt plus a long document,
then different short questions, one request after another, prefix caching on versus off (see
that file's docstring). Run through omni_pipeline.py (prefix_section), not on its own: it puts
bench/ and the repository on sys.path first."""

from __future__ import annotations

import statistics
import time

import numpy as np
from bench_table import table
from omni_bench_support import (
    QUESTIONS,
    SENTENCES,
    SYSTEM,
    hit,
    make_omni,
    mixed_requests,
    run_ours,
    stage_params,
)

from omni import Omni


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
        stream = omni.stream([prompt], stage_params(args, thinker_tokens=1), stream_audio=True)
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
        for r in omni.stream([prompt], stage_params(args), stream_audio=True):
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
