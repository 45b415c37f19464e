"""The sampler's time per step for B rows of a V-token vocabulary, against transformers' own
sampling of the same logits (its temperature / top-k / top-p warpers, softmax, torch.multinomial),
measured in the same run on the same device.

omni/runtime/sampler.py draws sampled rows among their candidates sorted by logit: rows with
0 < top_k <= TOP_K_CAP take `topk` of TOP_K_CAP columns instead of a sort of the whole
vocabulary, other filtered rows one sort for both filters. Rows: temperature only; top_p only (a
sort either way); top_k only; top_k and top_p (Qwen's generation config: 20 / 0.8); the same
with a seed per request (omni draws a seeded row's noise from its own generator). A second table:
what logprobs (0, 5, 20 alternatives) add to a greedy step, against the same step without them.
Each figure is the median of --repeat calls after one warm-up; on a GPU each call ends with the
ids' copy to the host. Nothing is asserted.

    python bench/sampler.py [--batch 16,64] [--vocab 151936] [--device cpu|cuda] [--repeat 7]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench_table import table  # noqa: E402
from transformers.generation.logits_process import (  # noqa: E402
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from omni.core.sampling_params import SamplingParams  # noqa: E402
from omni.core.scheduler_output import RunnerOutput  # noqa: E402
from omni.runtime.launched_step import LaunchedStep  # noqa: E402
from omni.runtime.sampler import Sampler  # noqa: E402
from omni.runtime.token_logprobs import logprob_frames  # noqa: E402

SETTINGS = {
    "temperature 0.7": SamplingParams(temperature=0.7),
    "top_p 0.8": SamplingParams(temperature=0.7, top_p=0.8),
    "top_k 20": SamplingParams(temperature=0.7, top_k=20),
    "top_k 20, top_p 0.8": SamplingParams(temperature=0.7, top_k=20, top_p=0.8),
    "the same, seeded": SamplingParams(temperature=0.7, top_k=20, top_p=0.8, seed=1),
}


def transformers_sampler(params: SamplingParams) -> Callable[[torch.Tensor], list[int]]:
    warpers = LogitsProcessorList([TemperatureLogitsWarper(params.temperature)])
    if params.top_k > 0:
        warpers.append(TopKLogitsWarper(params.top_k))
    if params.top_p < 1:
        warpers.append(TopPLogitsWarper(params.top_p))

    def sample(logits: torch.Tensor) -> list[int]:
        scores = warpers(None, logits.float())  # type: ignore[arg-type]  # ids unused by these
        return torch.multinomial(scores.softmax(dim=-1), 1).squeeze(1).tolist()

    return sample


def median_ms(call: Callable[[], object], repeat: int) -> float:
    call()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", default="16,64")
    parser.add_argument("--vocab", type=int, default=151936, help="Qwen2.5's vocabulary")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    device = torch.device(args.device)
    print(f"{args.vocab}-token vocabulary, {device}, median of {args.repeat} calls\n")
    rows = []
    for batch in (int(b) for b in args.batch.split(",")):
        generator = torch.Generator(device=device).manual_seed(batch)
        logits = torch.randn(batch, args.vocab, device=device, generator=generator) * 4
        logits = logits.to(torch.bfloat16 if device.type == "cuda" else torch.float32)
        for name, params in SETTINGS.items():
            sampler, hf = Sampler(seed=0, device=device), transformers_sampler(params)
            call = functools.partial(sampler, logits, [params] * batch, list(range(batch)))
            ours = median_ms(call, args.repeat)
            theirs = median_ms(functools.partial(hf, logits), args.repeat)
            rows.append([str(batch), name, f"{ours:.2f}", f"{theirs:.2f}", f"{theirs / ours:.1f}x"])
    table(["B", "sampling", "omni ms", "transformers ms", "omni faster"], rows)
    print("\nlogprobs (omni/runtime/token_logprobs.py): greedy rows with and without them, ids and")
    print("logprobs read on the host as a step reads them; baseline: the same rows without\n")
    rows = []
    for batch in (int(b) for b in args.batch.split(",")):
        generator = torch.Generator(device=device).manual_seed(batch)
        logits = torch.randn(batch, args.vocab, device=device, generator=generator) * 4
        logits = logits.to(torch.bfloat16 if device.type == "cuda" else torch.float32)
        base = median_ms(functools.partial(greedy_step, logits, None), args.repeat)
        rows.append([str(batch), "none (baseline)", f"{base:.2f}", "1.00"])
        for k in (0, 5, 20):
            ms = median_ms(functools.partial(greedy_step, logits, k), args.repeat)
            rows.append([str(batch), f"logprobs={k}", f"{ms:.2f}", f"{ms / base:.2f}"])
    table(["B", "logprobs", "ms", "x baseline"], rows)


def greedy_step(logits: torch.Tensor, k: int | None) -> RunnerOutput:
    """A greedy step's sampling, its logprobs (k: how many alternatives; None: none) and the
    host's read of both, as ModelRunner._sample and LaunchedStep.result do them."""
    params = [SamplingParams(logprobs=k)] * logits.shape[0]
    ids = Sampler(seed=0, device=logits.device).sample(logits, params, [], all_greedy=True)
    frames = logprob_frames(logits, ids, params) if k is not None else None
    return LaunchedStep([str(i) for i in range(len(params))], ids, None, frames).result()


if __name__ == "__main__":
    main()
