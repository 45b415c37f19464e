"""Host time of one decode step, per part, with the model's forward replaced by a stand-in.

On a GPU a decode step's device work (a replayed CUDA graph) is short, and everything the host
does around it runs serially with it: `StageEngine.step` = schedule -> execute -> update. This
times those host parts on the CPU, for B requests decoding together (the tiny qwen2 checkpoint,
the engine as a plain decoder stage, prefix caching on, no stage outputs, as bench/gpu.py's
decoder). The model body (`decode_forward`) and its captured graphs (`replay`) are replaced, in
this bench only, by stand-ins that return zero hidden states at once, so what is left is host
work:

- schedule: `scheduler.schedule()`
- prepare: `runner.execute` up to the body (block tables, slots, positions, the adapter's
  decode_prepare, the static buffers' fill and upload; or pack_batch when eager). As on a GPU,
  no attention plan is built: `attention.uses_triton` answers true in this bench
- sample: `runner.execute` after the body (the sampler's host work on stand-in logits, its ids
  back as Python ints, the output-cache write when kept)
- update: `engine.update()` (the scheduler's bookkeeping, stop checks, StageUpdate messages)

Prompts have different lengths (so requests cross block boundaries on different steps, as in
serving). Each B runs --rounds rounds of --steps decode steps; a part's figure is its mean per
step in its fastest round (noise from other processes only ever adds time). The clock is the
thread's CPU time (`time.thread_time`, about 0.6 us per reading, so time spent descheduled on a
busy machine does not count); --clock wall takes `time.perf_counter`.

    python bench/host_step.py [--batch 1,16,64,256] [--steps 64] [--rounds 5] [--clock cpu|wall] [--eager]
        [--outputs] [--no-caching] [--profile 64]
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from omni.config import load_config  # noqa: E402
from omni.core.sampling_params import SamplingParams  # noqa: E402
from omni.engine import StageEngine  # noqa: E402
from omni.messages import StageInput  # noqa: E402
from omni.runtime import attention  # noqa: E402
from omni.runtime.stage_model import ModelOutputs  # noqa: E402
from tools.make_tiny_checkpoint import ensure_checkpoint  # noqa: E402

PARTS = ("schedule", "prepare", "sample", "update")
PROMPT_TOKENS = 128
BLOCK_SIZE = 16


class StandIn:
    """The model body in this bench: zero hidden states, and when it was entered and left; and
    its logits: a narrow zero row per sampled token (token 0 wins), so that no device work of a
    GPU step (lm_head, argmax over the vocabulary) is counted as host time."""

    def __init__(self, hidden_size: int) -> None:
        self.hidden_size = hidden_size
        self.zeros = torch.zeros(1, hidden_size)
        self.logits = torch.zeros(1, 8)
        self.entered = self.left = 0.0
        self.clock = time.perf_counter

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        num_rows = hidden_states.shape[0]
        if self.logits.shape[0] < num_rows:
            self.logits = torch.zeros(num_rows, 8)
        return self.logits[:num_rows]

    def __call__(self, input_ids, positions, attn, embeds=None) -> ModelOutputs:
        self.entered = self.clock()
        num_tokens = input_ids.shape[0]
        if self.zeros.shape[0] < num_tokens:
            self.zeros = torch.zeros(num_tokens, self.hidden_size)
        out = ModelOutputs(hidden_states=self.zeros[:num_tokens])
        self.left = self.clock()
        return out


class StandInGraph:
    """A captured decode graph in this bench: `replay` does nothing but note the time (its
    outputs are the stand-in's zero rows), so that the padded path runs exactly the host code
    it runs on a GPU, where a replay replaces the body's call."""

    def __init__(self, stand_in: StandIn) -> None:
        self.stand_in = stand_in

    def replay(self) -> None:
        self.stand_in.entered = self.stand_in.left = self.stand_in.clock()


def install_stand_in_graphs(engine: StageEngine, stand_in: StandIn) -> None:
    graphs = engine.runner.decode_graphs
    if graphs is None:
        return
    for shape in graphs.shapes:
        graphs._graphs[shape] = StandInGraph(stand_in)
        graphs._graph_outputs[shape] = ModelOutputs(torch.zeros(shape[1], stand_in.hidden_size))


def make_engine(args: argparse.Namespace, batch: int) -> tuple[StageEngine, StandIn]:
    num_decode = args.warm_steps + args.rounds * args.steps
    max_len = -(-(PROMPT_TOKENS + BLOCK_SIZE + num_decode + 1) // BLOCK_SIZE) * BLOCK_SIZE
    engine_config = {
        "device": "cpu",
        "block_size": BLOCK_SIZE,
        "max_num_seqs": batch,
        "max_num_batched_tokens": 4096,
        "max_model_len": max_len,
        "num_blocks": batch * (max_len // BLOCK_SIZE) + 16,
        "enable_prefix_caching": not args.no_caching,
        "cuda_graphs": not args.eager,
    }
    if args.outputs:
        engine_config["outputs"] = ["hidden_states"]
    stage = {"name": "llm", "model": args.model, "engine": engine_config}
    engine = StageEngine(load_config({"stages": [stage]}).stages[0])
    stand_in = StandIn(engine.model.hidden_size)
    engine.model.decode_forward = stand_in  # type: ignore[method-assign]
    engine.model.compute_logits = stand_in.compute_logits  # type: ignore[method-assign]
    install_stand_in_graphs(engine, stand_in)
    return engine, stand_in


def measure(args: argparse.Namespace, batch: int) -> dict[str, float]:
    engine, stand_in = make_engine(args, batch)  # its warm-up ran the real model
    stand_in.clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    # From here the host work of the GPU path: attention metadata as the Triton kernel takes
    # it, without the CPU torch path's per-step plan (the stand-ins read no metadata at all).
    uses_triton = attention.uses_triton
    attention.uses_triton = lambda device: True  # type: ignore[assignment]
    try:
        return measure_steps(args, batch, engine, stand_in)
    finally:
        attention.uses_triton = uses_triton


def measure_steps(
    args: argparse.Namespace, batch: int, engine: StageEngine, stand_in: StandIn
) -> dict[str, float]:
    params = SamplingParams(max_tokens=100_000, ignore_eos=True)
    for i in range(batch):
        # Distinct prompts (no shared blocks) of lengths 128..143.
        ids = [(7 * i + 3 * j) % 500 + 1 for j in range(PROMPT_TOKENS + i % BLOCK_SIZE)]
        engine.add_request(StageInput(f"r{i}", ids, params))
    requests = list(engine.scheduler.requests.values())
    while not all(r.num_output_tokens > 0 for r in requests):
        engine.step()
    for _ in range(args.warm_steps):
        engine.step()
    best: dict[str, float] | None = None
    profiler = cProfile.Profile() if args.profile == batch else None
    clock = stand_in.clock
    for _ in range(args.rounds):
        sums = dict.fromkeys(PARTS, 0.0)
        if profiler is not None:
            profiler.enable()
        for _ in range(args.steps):
            t0 = clock()
            scheduled = engine.scheduler.schedule()
            t1 = clock()
            runner_output = engine.runner.execute(scheduled)
            t2 = clock()
            engine.update(scheduled, runner_output)
            t3 = clock()
            if len(scheduled.scheduled) != batch or len(runner_output.sampled_token_ids) != batch:
                raise SystemExit(f"B={batch}: a timed step was not a decode step of all B")
            sums["schedule"] += t1 - t0
            sums["prepare"] += stand_in.entered - t1
            sums["sample"] += t2 - stand_in.left
            sums["update"] += t3 - t2
        if profiler is not None:
            profiler.disable()
        means = {part: total / args.steps for part, total in sums.items()}
        best = means if best is None else {p: min(best[p], means[p]) for p in PARTS}
    if profiler is not None:
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
    assert best is not None
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", default="1,16,64,256", help="comma-separated B values")
    parser.add_argument("--steps", type=int, default=64, help="timed decode steps per round")
    parser.add_argument("--rounds", type=int, default=5, help="rounds per B (fastest per part)")
    parser.add_argument("--warm-steps", type=int, default=8)
    parser.add_argument(
        "--clock", choices=("cpu", "wall"), default="cpu", help="thread CPU time or wall time"
    )
    parser.add_argument("--eager", action="store_true", help="engine.cuda_graphs false")
    parser.add_argument("--outputs", action="store_true", help="keep hidden_states (a thinker)")
    parser.add_argument("--no-caching", action="store_true", help="prefix caching off")
    parser.add_argument("--profile", type=int, default=0, help="cProfile the rounds of this B")
    parser.add_argument("--model", default=None, help="checkpoint (default: tiny qwen2)")
    args = parser.parse_args()
    args.model = args.model or str(ensure_checkpoint("qwen2", "tiny", 0))
    torch.set_num_threads(1)
    batches = [int(b) for b in args.batch.split(",")]
    mode = "eager (pack_batch)" if args.eager else "padded (the CUDA-graph path, run eagerly)"
    print(
        f"host {args.clock} time per decode step, us (forward replaced by a stand-in); {mode}, prefix "
        f"caching {'off' if args.no_caching else 'on'}, outputs "
        f"{'hidden_states' if args.outputs else 'none'}; per part the fastest of {args.rounds} rounds of "
        f"{args.steps} steps\n"
    )
    print(f"| B | {' | '.join(PARTS)} | host total | per request |")
    print(f"|---|{'---|' * (len(PARTS) + 2)}")
    for batch in batches:
        means = measure(args, batch)
        total = sum(means.values())
        cells = " | ".join(f"{means[p] * 1e6:.0f}" for p in PARTS)
        print(f"| {batch} | {cells} | {total * 1e6:.0f} | {total * 1e6 / batch:.1f} |", flush=True)


if __name__ == "__main__":
    main()
