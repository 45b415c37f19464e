"""Automatic prefix caching on the single-stage engine, on the larger tiny model (~27 M params).

1. Long document (shared/seeds/004_*.txt): one question warms the cache, then later questions
   about the same table: time to first token (TTFT) and total time, caching on vs off, with the
   hit rate and the theoretical speedup limit (prompt tokens / uncached tokens).
2. The cost of caching at a 0% hit rate: throughput on prompts that share nothing, on vs off.
3. Our engine against transformers `generate` on the same 16 prompts (batched, left-padded).

    .venv/bin/python bench/apc.py [--model DIR] [--questions 4] [--max-tokens 32]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

from long_document import PEOPLE, long_prompt, question  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from omni.config import config_for_model  # noqa: E402
from omni.core.sampling_params import SamplingParams  # noqa: E402
from omni.engine import StageEngine  # noqa: E402
from omni.messages import StageInput  # noqa: E402


def engine_for(model_dir: str, caching: bool, **engine) -> StageEngine:
    config = config_for_model(
        model_dir, {"stages.llm.engine": {"enable_prefix_caching": caching, **engine}}
    )
    return StageEngine(config.stages[0])


def timed_request(engine: StageEngine, request_id: str, token_ids: list[int], max_tokens: int):
    """(TTFT, total seconds, result) for one request run alone."""
    engine.add_request(
        StageInput(request_id, token_ids, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    )
    start = time.perf_counter()
    ttft = None
    while True:
        output = engine.step()  # an EngineOutput: .updates of running, .finished results
        if ttft is None:
            ttft = time.perf_counter() - start
        if output.finished:
            return ttft, time.perf_counter() - start, output.finished[0]


def long_document(model_dir: str, tokenizer, args) -> None:
    document = tokenizer.encode(long_prompt())
    names = [p[0] for p in PEOPLE][: args.questions + 1]
    prompts = [document + tokenizer.encode(question(name)) for name in names]
    rows = {}
    for caching in (False, True):
        engine = engine_for(model_dir, caching)
        timed_request(engine, "warm", prompts[0], args.max_tokens)
        runs = [
            timed_request(engine, f"q{i}", p, args.max_tokens) for i, p in enumerate(prompts[1:])
        ]
        rows[caching] = runs
    num_prompt = statistics.mean(len(p) for p in prompts[1:])
    num_cached = statistics.mean(r[2].num_cached_tokens for r in rows[True])
    limit = num_prompt / (num_prompt - num_cached)
    # The floor of any TTFT: one forward over just the uncached tokens, no context at all. On a
    # CPU a forward of a few tokens costs about one read of all the weights, not tokens x FLOPs.
    floor_engine = engine_for(model_dir, False)
    suffix_len = round(num_prompt - num_cached)
    floor = statistics.median(
        timed_request(floor_engine, f"f{i}", p[-suffix_len:], 1)[0]
        for i, p in enumerate(prompts[1:])
    )
    ttft_off = statistics.median(r[0] for r in rows[False])
    ttft_on = statistics.median(r[0] for r in rows[True])
    total_off = statistics.median(r[1] for r in rows[False])
    total_on = statistics.median(r[1] for r in rows[True])
    print(
        f"\n1. Long document: {len(document)}-token table, {args.questions} later questions, "
        f"{args.max_tokens} new tokens each (medians)"
    )
    print(f"{'caching':>8} | {'TTFT ms':>8} | {'total ms':>9} | {'hit rate':>8}")
    print(f"{'off':>8} | {ttft_off * 1e3:>8.1f} | {total_off * 1e3:>9.1f} | {0:>8.1%}")
    print(
        f"{'on':>8} | {ttft_on * 1e3:>8.1f} | {total_on * 1e3:>9.1f} | {num_cached / num_prompt:>8.1%}"
    )
    speedup = ttft_off / ttft_on
    print(
        f"TTFT speedup {speedup:.1f}x; theoretical limit {limit:.1f}x (prompt / uncached tokens); "
        f"{speedup / limit:.0%} of the limit. Total-time speedup {total_off / total_on:.2f}x."
    )
    attainable = ttft_off / floor
    print(
        f"Floor: a {suffix_len}-token forward with no context takes {floor * 1e3:.1f} ms (on a CPU a "
        f"few-token forward costs about one read of all weights), so {attainable:.1f}x is the "
        f"attainable TTFT speedup here; reached {speedup / attainable:.0%} of it."
    )


def zero_hit_cost(model_dir: str, vocab: int, args) -> None:
    rng = random.Random(1)
    prompts = [
        [rng.randrange(3, vocab) for _ in range(args.unique_len)]
        for _ in range(args.unique_prompts)
    ]
    throughput = {True: [], False: []}
    for repeat in range(args.repeats):
        for caching in (False, True) if repeat % 2 == 0 else (True, False):
            engine = engine_for(model_dir, caching)
            params = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True)
            for i, p in enumerate(prompts):
                # A per-repeat salt-free unique prefix: nothing can hit.
                engine.add_request(StageInput(f"u{i}", [repeat + 3] + p, params))
            start = time.perf_counter()
            results = engine.run_until_done()
            elapsed = time.perf_counter() - start
            assert all(r.num_cached_tokens == 0 for r in results)
            num_tokens = sum(r.num_prompt_tokens + len(r.token_ids) for r in results)
            throughput[caching].append(num_tokens / elapsed)
    off, on = statistics.median(throughput[False]), statistics.median(throughput[True])
    print(
        f"\n2. 0% hit rate: {args.unique_prompts} unique prompts x {args.unique_len} tokens, "
        f"{args.max_tokens} new tokens, median of {args.repeats}"
    )
    print(f"{'caching':>8} | {'tokens/s':>9}")
    print(f"{'off':>8} | {off:>9.0f}")
    print(f"{'on':>8} | {on:>9.0f}")
    print(
        f"caching on / off: {on / off:.3f} (throughput change with caching on: {on / off - 1:+.1%})"
    )


def versus_transformers(model_dir: str, vocab: int, args) -> None:
    rng = random.Random(2)
    prompts = [[rng.randrange(3, vocab) for _ in range(rng.randrange(64, 256))] for _ in range(16)]
    params = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True)
    engine = engine_for(model_dir, True)
    for i, p in enumerate(prompts):
        engine.add_request(StageInput(f"t{i}", p, params))
    start = time.perf_counter()
    ours = engine.run_until_done()
    ours_s = time.perf_counter() - start
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    start = time.perf_counter()
    with torch.inference_mode():
        model.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=args.max_tokens,
            do_sample=False,
            pad_token_id=0,
        )
    hf_s = time.perf_counter() - start
    new_tokens = 16 * args.max_tokens
    print(f"\n3. 16 prompts (64-255 tokens), {args.max_tokens} new tokens each, greedy")
    print(f"{'engine':>14} | {'seconds':>8} | {'new tok/s':>9} | {'ratio':>6}")
    print(f"{'transformers':>14} | {hf_s:>8.2f} | {new_tokens / hf_s:>9.1f} | {1:>6.2f}")
    print(f"{'omni':>14} | {ours_s:>8.2f} | {new_tokens / ours_s:>9.1f} | {hf_s / ours_s:>6.2f}")
    assert len(ours) == 16


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", help="checkpoint directory (default: the bench-size tiny qwen2)")
    parser.add_argument("--questions", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--unique-prompts", type=int, default=16)
    parser.add_argument("--unique-len", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.model is None:
        from tools.make_tiny_checkpoint import ensure_checkpoint

        args.model = str(ensure_checkpoint("qwen2", "bench"))
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    vocab = len(tokenizer)
    print(f"model: {args.model}, torch threads: {args.threads}")
    long_document(args.model, tokenizer, args)
    zero_hit_cost(args.model, vocab, args)
    versus_transformers(args.model, vocab, args)


if __name__ == "__main__":
    main()
