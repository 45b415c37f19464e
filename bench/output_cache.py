"""Stage-output cache costs.

1. Gather of a hit (1k..64k rows, D 1024..4096, float32) from the mirrored cache into a new
   tensor, against a plain torch copy of the same bytes into a new tensor (clone), as a
   bandwidth ratio (aim >= 0.5).
2. Per-step write cost (one indexed copy) against the forward pass of the bench model (aim < 2%).
3. End to end: a stage returning full-sequence hidden states for a repeated long prompt, output
   caching on vs off (off = the prefix is recomputed), with the hit rate.

    .venv/bin/python bench/output_cache.py [--quick]
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

from omni.config import config_for_model  # noqa: E402
from omni.core.sampling_params import SamplingParams  # noqa: E402
from omni.engine import StageEngine  # noqa: E402
from omni.messages import StageInput  # noqa: E402
from omni.runtime.output_cache import OutputCache  # noqa: E402


def best_of(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def gather_table(args) -> None:
    block_size = 16
    print("\n1. Gather of a prefix hit vs a plain copy (clone) of the same bytes (best of 5)")
    print(
        f"{'rows':>6} | {'D':>5} | {'MiB':>6} | {'gather GB/s':>11} | {'copy GB/s':>9} | {'ratio':>5}"
    )
    dims = (1024, 4096) if args.quick else (1024, 2048, 4096)
    rows_list = (1024, 8192) if args.quick else (1024, 8192, 65536)
    for dim in dims:
        num_blocks = max(rows_list) // block_size + 16
        cache = OutputCache(num_blocks, block_size, torch.float32)
        cache.allocate("hidden_states", (dim,))
        cache.caches["hidden_states"].normal_()
        for rows in rows_list:
            block_ids = random.Random(rows).sample(range(num_blocks), rows // block_size)
            src = torch.randn(rows, dim)
            gather_s = best_of(
                lambda c=cache, b=block_ids, r=rows: c.gather(b, r, admitted_step=1), 5
            )
            # Both produce a new tensor to hand to the next stage (fresh pages included).
            copy_s = best_of(lambda s=src: s.clone(), 5)
            nbytes = rows * dim * 4
            print(
                f"{rows:>6} | {dim:>5} | {nbytes / 2**20:>6.0f} | {nbytes / gather_s / 1e9:>11.2f} | "
                f"{nbytes / copy_s / 1e9:>9.2f} | {copy_s / gather_s:>5.2f}"
            )


def write_cost(model_dir: str) -> None:
    # This stage keeps its hidden states as if another stage consumed them.
    config = config_for_model(
        model_dir, {"stages.llm.engine": {"num_blocks": 512, "outputs": ["hidden_states"]}}
    )
    engine = StageEngine(config.stages[0])
    cache = engine.output_cache
    dim = engine.model.hidden_size
    print("\n2. Output-cache write per step vs the forward pass (bench model, best of 3)")
    print(f"{'step':>16} | {'tokens':>6} | {'forward ms':>10} | {'write ms':>8} | {'share':>6}")
    rng = random.Random(0)
    for label, num_seqs, num_tokens in (("prefill", 1, 1024), ("decode batch 16", 16, 16)):
        prompts = [
            [rng.randrange(3, 2000) for _ in range(num_tokens // num_seqs)] for _ in range(num_seqs)
        ]
        for i, p in enumerate(prompts):
            engine.add_request(StageInput(f"{label}{i}", p, SamplingParams(max_tokens=1)))
        scheduler_output = engine.scheduler.schedule()
        batch = engine.runner._pack(
            scheduler_output.scheduled, engine.runner.requests.track(scheduler_output.scheduled)
        )
        with torch.inference_mode():
            forward_s = best_of(lambda b=batch: engine.model.forward(b.model_inputs), 3)
        rows = torch.randn(batch.slot_mapping.numel(), dim)
        write_s = best_of(
            lambda b=batch, r=rows: cache.write(b.slot_mapping, {"hidden_states": r}), 3
        )
        engine.update(scheduler_output, engine.runner.execute(scheduler_output))
        engine.run_until_done()
        print(
            f"{label:>16} | {batch.slot_mapping.numel():>6} | {forward_s * 1e3:>10.1f} | "
            f"{write_s * 1e3:>8.3f} | {write_s / forward_s:>6.2%}"
        )


def end_to_end(model_dir: str, args) -> None:
    rng = random.Random(1)
    document = [rng.randrange(3, 2000) for _ in range(args.prompt_len)]
    questions = [[rng.randrange(3, 2000) for _ in range(12)] for _ in range(args.questions + 1)]
    print(
        f"\n3. Repeated {args.prompt_len}-token prefix, {args.questions} later requests returning full hidden states"
    )
    print(
        f"{'output cache':>12} | {'median s/request':>16} | {'hit rate':>8} | {'rows served':>11} | {'rows recomputed':>15}"
    )
    medians = {}
    for cache_outputs in (False, True):
        engine_overrides = {"cache_outputs": cache_outputs, "outputs": ["hidden_states"]}
        config = config_for_model(model_dir, {"stages.llm.engine": engine_overrides})
        engine = StageEngine(config.stages[0])
        params = SamplingParams(max_tokens=4, ignore_eos=True)
        engine.add_request(StageInput("warm", document + questions[0], params))
        engine.run_until_done()
        times, results = [], []
        for i, q in enumerate(questions[1:]):
            engine.add_request(StageInput(f"q{i}", document + q, params))
            start = time.perf_counter()
            results.extend(engine.run_until_done())
            times.append(time.perf_counter() - start)
        assert all(r.tensors["hidden_states"].shape[0] == len(document) + 12 + 3 for r in results)
        stats = engine.stats()
        hit_rate = sum(r.num_cached_tokens for r in results) / sum(
            r.num_prompt_tokens for r in results
        )
        medians[cache_outputs] = statistics.median(times)
        print(
            f"{'on' if cache_outputs else 'off':>12} | {medians[cache_outputs]:>16.3f} | {hit_rate:>8.1%} | "
            f"{stats['output_hit_rows']:>11} | {stats['rows_recomputed']:>15}"
        )
    print(f"speedup with the output cache: {medians[False] / medians[True]:.1f}x")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", help="checkpoint directory (default: the bench-size tiny qwen2)")
    parser.add_argument("--prompt-len", type=int, default=1500)
    parser.add_argument("--questions", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="fewer gather sizes")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.model is None:
        from tools.make_tiny_checkpoint import ensure_checkpoint

        args.model = str(ensure_checkpoint("qwen2", "bench"))
    gather_table(args)
    write_cost(args.model)
    end_to_end(args.model, args)


if __name__ == "__main__":
    main()
