"""Prefix hit rate with stage replicas on Ray: one replica, two with cache-aware routing, two
round-robin, two least-loaded, on a shared-prefix workload (documents asked about several times,
the questions shuffled), through the real pipeline (a one-stage tiny Qwen2 causal LM, each replica
its own actor with its own prefix cache, on a private local Ray instance).

    .venv/bin/python bench/replica_routing.py [--documents 24] [--questions 3] [--concurrency 4]

The hit rate is the stage's `kv_hit_tokens / kv_queried_tokens` summed over its replicas. Every
routing gets the same requests in the same order; tokens are checked equal across routings
(greedy), so the rows differ only in where the requests ran.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from omni import Omni  # noqa: E402
from omni.core.sampling_params import SamplingParams  # noqa: E402
from tools.make_tiny_checkpoint import ensure_checkpoint  # noqa: E402

ROUTINGS = [("1 replica", 1, "cache_aware")] + [
    (f"2 replicas, {policy}", 2, policy)
    for policy in ("cache_aware", "round_robin", "least_loaded")
]


def workload(documents: int, questions: int, seed: int) -> list[list[int]]:
    """Each document (256 tokens) asked `questions` times with its own 32-token question."""
    rng = random.Random(seed)
    docs = [[rng.randrange(1, 500) for _ in range(256)] for _ in range(documents)]
    prompts = [
        d + [rng.randrange(1, 500) for _ in range(32)] for d in docs for _ in range(questions)
    ]
    rng.shuffle(prompts)
    return prompts


def run(model: str, replicas: int, policy: str, prompts: list, concurrency: int) -> dict:
    overrides = {
        "runtime.backend": "ray",
        "runtime.replica_routing": policy,
        "stages.llm.resources.replicas": replicas,
        "stages.llm.resources.num_cpus": 0.5,
        "stages.llm.engine.device": "cpu",
    }
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    with Omni(model=model, **overrides) as omni:
        started = time.perf_counter()
        outputs = []
        for i in range(0, len(prompts), concurrency):  # a few at a time: load stays even
            outputs += omni.generate(prompts[i : i + concurrency], params, use_tqdm=False)
        elapsed = time.perf_counter() - started
        stats = omni.stats()["llm"]
    assert all(o.error is None for o in outputs), [o.error for o in outputs if o.error]
    return {
        "tokens": [o.final.token_ids for o in outputs],
        "hit_rate": stats["kv_hit_tokens"] / max(stats["kv_queried_tokens"], 1),
        "req_s": len(prompts) / elapsed,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--documents", type=int, default=24)
    parser.add_argument("--questions", type=int, default=3, help="requests per document")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    model = str(ensure_checkpoint("qwen2", "tiny", 0))
    prompts = workload(args.documents, args.questions, args.seed)
    print(
        f"{len(prompts)} requests: {args.documents} documents x {args.questions} questions, "
        f"{args.concurrency} at a time; tiny Qwen2 on a private Ray instance"
    )
    print(f"{'routing':<26} | {'hit rate':>8} | {'vs 1 replica':>12} | {'req/s':>6}")
    baseline = None
    for label, replicas, policy in ROUTINGS:
        result = run(model, replicas, policy, prompts, args.concurrency)
        baseline = baseline or result
        assert result["tokens"] == baseline["tokens"], f"{label}: tokens differ from 1 replica"
        ratio = result["hit_rate"] / baseline["hit_rate"] if baseline["hit_rate"] else float("nan")
        print(
            f"{label:<26} | {result['hit_rate']:>8.3f} | {ratio:>11.2f}x | {result['req_s']:>6.1f}"
        )


if __name__ == "__main__":
    main()
