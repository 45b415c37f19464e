"""Split-KV attention (kernels/split_kv.py): the Triton paged attention with and without its keys
split over programs, per layer call, on the shapes where the grid is small.

Run on a GPU:   PYTHONPATH=. python bench/split_kv.py [--layout 0.5b|7b|both] [--iters 50]
CPU smoke test: PYTHONPATH=. python bench/split_kv.py --device cpu   (tiny shapes, Triton's
interpreter: checks that both paths run and agree; its timings mean nothing)

Cases: decode batches of B sequences each with a context of C cached keys (one query token
each), and one 16-token suffix after a C-key cached prefix (a prompt's prefix-cache hit). On a
GPU each call is captured in a CUDA graph of --layers calls and replayed (what the engine's
graphs leave: kernel time, no Python launch cost); the figure is per layer call. "splits" is the
default choice for this GPU's SM count with the context as the bound (num_kv_splits); the split
column is the kernel at that count plus the combine kernel. Ratios: unsplit / split, from the
same run. A sweep of fixed counts (2 to 32) gives the best count and how far the choice is from
it (the data to tune MIN_SHARE and PROGRAMS_PER_SM by). The largest difference between the
unsplit and split outputs is printed too. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import functools
import time

import torch
from bench_table import table

from kernels import split_kv
from kernels.triton_paged_attention import triton_paged_attention

LAYOUTS = {"0.5b": (14, 2, 64), "7b": (28, 4, 128)}  # query heads, kv heads, head dim
BLOCK_SIZE = 16


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--layout", default="both", choices=[*LAYOUTS, "both"])
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--layers", type=int, default=24, help="calls per captured graph")
    return parser.parse_args()


def make_case(device: str, heads: tuple[int, int, int], specs: list[tuple[int, int]]) -> dict:
    """Inputs for (q_len, seq_len) per sequence, bf16 on a GPU (float32 on the CPU), every
    sequence's blocks contiguous in one pool."""
    num_heads, num_kv_heads, head_dim = heads
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    blocks = [-(-seq_len // BLOCK_SIZE) for _, seq_len in specs]
    width = max(blocks)
    tables = torch.zeros(len(specs), width, dtype=torch.int32)
    start = 0
    for i, n in enumerate(blocks):
        tables[i, :n] = torch.arange(start, start + n)
        start += n
    shape = (start, BLOCK_SIZE, num_kv_heads, head_dim)
    q_lens = torch.tensor([q for q, _ in specs])
    starts = torch.zeros(len(specs) + 1, dtype=torch.int32)
    starts[1:] = torch.cumsum(q_lens, 0)
    case = dict(
        query=torch.randn(int(starts[-1]), num_heads, head_dim),
        key_cache=torch.randn(shape),
        value_cache=torch.randn(shape),
        block_tables=tables,
        seq_lens=torch.tensor([s for _, s in specs], dtype=torch.int32),
        query_start_loc=starts,
    )
    return {
        k: v.to(device=device, dtype=dtype if v.is_floating_point() else v.dtype)
        for k, v in case.items()
    }


def per_call_ms(run, device: str, iters: int, layers: int) -> float:
    """Mean ms of one call: a CUDA graph of `layers` calls replayed `iters` times (GPU), or
    plain calls timed on the host (CPU smoke run)."""
    if device != "cuda":
        start = time.perf_counter()
        run()
        return (time.perf_counter() - start) * 1e3
    for _ in range(2):  # compile, autotune nothing, warm caches
        run()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(layers):
            run()
    graph.replay()
    torch.cuda.synchronize()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for _ in range(iters):
        graph.replay()
    end.record()
    end.synchronize()
    return begin.elapsed_time(end) / (iters * layers)


def main() -> None:
    args = parse_args()
    device = args.device
    cpu = device == "cpu"
    if cpu:  # the smoke run splits as an H100 (132 SMs) would
        split_kv.num_sms = lambda device: 132  # type: ignore[assignment]
    sms = split_kv.num_sms(torch.device(device))
    layouts = list(LAYOUTS) if args.layout == "both" else [args.layout]
    layouts = layouts[:1] if cpu else layouts  # the CPU runs one tiny layout
    contexts = [600] if cpu else [1024, 4096, 16384]
    batches = [1, 4] if cpu else [1, 4, 16, 64]
    sweep = [2] if cpu else [2, 4, 8, 16, 32]
    print(f"device {device}, {sms} SMs; per layer call, ms")
    rows = []
    for layout in layouts:
        heads = LAYOUTS[layout] if not cpu else (4, 2, 32)
        for context in contexts:
            cases = [(f"decode B={b}", [(1, context)] * b) for b in batches]
            cases.append(("suffix 16", [(16, context + 16)]))
            for name, specs in cases:
                call = functools.partial(
                    triton_paged_attention,
                    **make_case(device, heads, specs),
                    scale=heads[2] ** -0.5,
                    max_context=max(s for _, s in specs),
                    step_cache={},
                )
                whole, split = call(num_splits=1), call()
                # The count the default launch chose: its partial buffers' key (none: 1).
                cached = call.keywords["step_cache"]
                chosen = max((key[1] for key in cached if key[0] == "split_kv"), default=1)
                diff = (whole.float() - split.float()).abs().max().item()
                unsplit = functools.partial(call, num_splits=1)
                ms_whole = per_call_ms(unsplit, device, args.iters, args.layers)
                ms_split = per_call_ms(call, device, args.iters, args.layers)
                # The sweep: what a fixed count would give (tunes MIN_SHARE, PROGRAMS_PER_SM).
                timed = {1: ms_whole, chosen: ms_split}
                for n in sweep:
                    if n not in timed:
                        fixed = functools.partial(call, num_splits=n)
                        timed[n] = per_call_ms(fixed, device, args.iters, args.layers)
                best = min(timed, key=lambda n: timed[n])
                rows.append(
                    [
                        layout,
                        str(context),
                        name,
                        str(chosen),
                        f"{ms_whole:.4f}",
                        f"{ms_split:.4f}",
                        f"{ms_whole / ms_split:.2f}x",
                        f"{best}: {timed[best]:.4f} ({timed[chosen] / timed[best]:.2f}x)",
                        f"{diff:.1e}",
                    ]
                )
    header = ["layout", "context", "case", "splits", "unsplit", "split", "ratio"]
    table([*header, "best splits: ms (chosen / best)", "max diff"], rows)


if __name__ == "__main__":
    main()
