"""Per-layer cost of paged attention: per-sequence loop vs padded (vectorized) variant vs auto.

Run: PYTHONPATH=. .venv/bin/python bench/paged_attention.py [--repeats N] [--threads T]
Shapes follow a small Qwen2-like model (8 query heads, 2 kv heads, head_dim 64, block size 16,
float32). Each row times one paged_attention call with a plan built beforehand, as a model layer
sees it; "plan ms" is the one-off make_plan cost per step. The machine is shared: compare the
columns of one run, never absolute numbers across runs.

What the measurements taught (and make_plan encodes):
- A long prefill with nothing cached: is_causal SDPA is ~2x faster than any explicit mask.
- A long chunk on a cached prefix: prefix (no mask) + new tokens (is_causal) merged by
  log-sum-exp beats the masked call, increasingly with the chunk length.
- Decodes and short chunks: one padded call per group instead of one call per sequence wins
  2-5x on short contexts (call overhead); with long contexts a single huge padded gather is
  memory-bound and loses, so groups are capped at PADDED_MAX_KEYS padded keys.
- Folding the GQA group into the query axis beats enable_gqa and repeated K/V.
"""

import argparse
import functools
import random
import time

import torch

from kernels.paged_attention import make_plan, paged_attention

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE = 8, 2, 64, 16


def build_batch(specs: list[tuple[int, int]], rng: random.Random):
    """specs: (q_len, seq_len) per sequence; blocks are handed out in shuffled order."""
    blocks_per_seq = [-(-seq_len // BLOCK_SIZE) for _, seq_len in specs]
    block_ids = list(range(sum(blocks_per_seq)))
    rng.shuffle(block_ids)
    block_tables = torch.zeros(len(specs), max(blocks_per_seq), dtype=torch.int64)
    start = 0
    for i, num_blocks in enumerate(blocks_per_seq):
        block_tables[i, :num_blocks] = torch.tensor(block_ids[start : start + num_blocks])
        start += num_blocks
    cache_shape = (len(block_ids), BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
    q_lens = torch.tensor([q_len for q_len, _ in specs])
    return dict(
        query=torch.randn(int(q_lens.sum()), NUM_HEADS, HEAD_DIM),
        key_cache=torch.randn(cache_shape),
        value_cache=torch.randn(cache_shape),
        block_tables=block_tables,
        seq_lens=torch.tensor([seq_len for _, seq_len in specs]),
        query_start_loc=torch.cat([torch.zeros(1, dtype=torch.int64), q_lens.cumsum(0)]),
    )


def scenarios(rng: random.Random) -> dict[str, list[tuple[int, int]]]:
    def ctx(lo: int, hi: int) -> int:
        return rng.randint(lo, hi)

    return {
        "prefill 1x2048": [(2048, 2048)],
        "prefill 512 on ctx 2048": [(512, 2048)],
        "prefill 2048 on ctx 4096": [(2048, 4096)],
        "prefill 64 on ctx 2048": [(64, 2048)],
        "prefill 4x256": [(256, 256)] * 4,
        "prefill 8x16, ctx 16-300": [(16, ctx(16, 300)) for _ in range(8)],
        "decode 4, ctx 500": [(1, 500)] * 4,
        "decode 8, ctx 1000": [(1, 1000)] * 8,
        "decode 32, ctx 2000": [(1, 2000)] * 32,
        "decode 32, ctx 100-2000": [(1, ctx(100, 2000)) for _ in range(32)],
        "decode 32, ctx 100-200": [(1, ctx(100, 200)) for _ in range(32)],
        "mixed 512 + 16 dec 100-2000": [(512, 512)] + [(1, ctx(100, 2000)) for _ in range(16)],
        "mixed 8 + 16 dec 100-2000": [(8, 600)] + [(1, ctx(100, 2000)) for _ in range(16)],
    }


def best_times_ms(calls: dict, repeats: int) -> dict[str, float]:
    """Best time of each call, calling them round-robin so that load from other processes (the
    machine is shared) hits every variant alike; the minimum is the least disturbed run."""
    for call in calls.values():
        call()  # warm-up: lazy mask conversion, allocator
    best = dict.fromkeys(calls, float("inf"))
    for _ in range(repeats):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            best[name] = min(best[name], (time.perf_counter() - start) * 1e3)
    return best


def describe(plan) -> str:
    """What auto chose: single causal/split calls and padded groups (sequences per group)."""
    parts = [
        f"{sum(not s.split for s in plan.singles)} causal",
        f"{sum(s.split for s in plan.singles)} split",
    ]
    sizes = "+".join(str(g.num_seqs) for g in plan.groups)
    parts.append(f"pad[{sizes}]" if sizes else "")
    return " ".join(p for p in parts if p and not p.startswith("0 "))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    rng = random.Random(0)
    scale = HEAD_DIM**-0.5
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, H={NUM_HEADS} "
        f"Hkv={NUM_KV_HEADS} D={HEAD_DIM} block_size={BLOCK_SIZE}, best of {args.repeats}"
    )
    header = (
        f"{'scenario':<29}{'loop ms':>9}{'padded ms':>11}{'loop/pad':>9}{'auto ms':>9}"
        f"{'plan ms':>9}  auto runs"
    )
    print(header)
    print("-" * (len(header) + 16))
    for name, specs in scenarios(rng).items():
        batch = build_batch(specs, rng)
        tensors = (batch["query"], batch["key_cache"], batch["value_cache"])
        meta = (batch["block_tables"], batch["seq_lens"], batch["query_start_loc"])
        plans = {s: make_plan(*meta, BLOCK_SIZE, strategy=s) for s in ("loop", "padded", "auto")}
        calls = {
            s: functools.partial(paged_attention, *tensors, *meta, scale, plan=plan)
            for s, plan in plans.items()
        }
        calls["plan"] = functools.partial(make_plan, *meta, BLOCK_SIZE)
        ms = best_times_ms(calls, args.repeats)
        print(
            f"{name:<29}{ms['loop']:>9.2f}{ms['padded']:>11.2f}{ms['loop'] / ms['padded']:>9.2f}"
            f"{ms['auto']:>9.2f}{ms['plan']:>9.2f}  {describe(plans['auto'])}"
        )


if __name__ == "__main__":
    main()
