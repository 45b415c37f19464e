"""Per-layer cost of paged attention: per-sequence loop vs padded (vectorized) variant vs auto.

Run: .venv/bin/python bench/paged_attention.py [--repeats N]
Shapes follow a small Qwen2-like model (8 query heads, 2 kv heads, head_dim 64, block size 16,
float32). Each row times one paged_attention call with a plan built beforehand, as a model layer
sees it (best of --repeats); "plan ms" is the one-off make_plan cost per step. Timings vary between runs on shared
machines: compare the columns of one run, never absolute numbers across runs.
"""

import argparse
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


def time_ms(fn, repeats: int) -> float:
    fn()  # warm-up: lazy mask conversion, allocator
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e3)
    return min(samples)  # the least disturbed run: other processes share the 2 cores


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
    header = f"{'scenario':<30}{'loop ms':>10}{'padded ms':>11}{'loop/pad':>10}{'auto ms':>10}"
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, H={NUM_HEADS} "
          f"Hkv={NUM_KV_HEADS} D={HEAD_DIM} block_size={BLOCK_SIZE}")
    print(header + f"{'plan ms':>10}")
    print("-" * (len(header) + 10))
    for name, specs in scenarios(rng).items():
        batch = build_batch(specs, rng)
        meta = (batch["block_tables"], batch["seq_lens"], batch["query_start_loc"], BLOCK_SIZE)
        results = {}
        for strategy in ("loop", "padded", "auto"):
            plan = make_plan(*meta, strategy=strategy)

            def call(plan=plan):
                return paged_attention(
                    batch["query"], batch["key_cache"], batch["value_cache"],
                    *meta[:3], scale, plan=plan,
                )  # fmt: skip

            results[strategy] = time_ms(call, args.repeats)
        plan_ms = time_ms(lambda meta=meta: make_plan(*meta), args.repeats)
        loop_ms, padded_ms = results["loop"], results["padded"]
        print(f"{name:<30}{loop_ms:>10.2f}{padded_ms:>11.2f}{loop_ms / padded_ms:>10.2f}"
              f"{results['auto']:>10.2f}{plan_ms:>10.2f}")


if __name__ == "__main__":
    main()
