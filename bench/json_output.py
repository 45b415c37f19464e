"""Structured output's cost (SamplingParams.json_schema, chat's `response_format`): B requests
decoding together on one StageEngine, unconstrained (the baseline, measured in the same run),
constrained to any JSON object, and to a schema; decode step time (the median of the steps where
all B decode), the host work the masks add to a step (the scheduler's masks, and the sampler's
upload and unpack), and the token masks computed (cold: the first round; warm: a second round of
the same requests, every state's mask already kept). Then the cost of one cold mask over the
vocabulary: where the reply starts, where a property's value starts (whitespace may come first:
the most tokens to run), inside a string.

The model: SmolLM2-135M-Instruct (49,152 tokens; tools/convert_gguf.py --smollm2), else the
tiny Qwen2 (512). Greedy, ignore_eos (a whole value then takes whitespace). Nothing is asserted.

    python bench/json_output.py [--batch 1,8,32] [--tokens 48] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench_table import table  # noqa: E402

from omni.config import load_config  # noqa: E402
from omni.core.json_constraint import JsonConstraint, JsonCursor  # noqa: E402
from omni.core.json_grammar import initial  # noqa: E402
from omni.core.json_schema import compile_schema  # noqa: E402
from omni.core.sampling_params import SamplingParams  # noqa: E402
from omni.engine import StageEngine  # noqa: E402
from omni.messages import StageInput  # noqa: E402
from omni.runtime import model_runner  # noqa: E402

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "address": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
    "required": ["name", "age", "tags"],
}
KINDS = {"none": None, "json_object": {"type": "object"}, "json_schema": SCHEMA}


def model_dir() -> str:
    from tools.convert_gguf import ensure_smollm2, smollm2_installed
    from tools.make_tiny_checkpoint import ensure_checkpoint

    return str(ensure_smollm2() if smollm2_installed() else ensure_checkpoint("qwen2", "tiny", 0))


class Timed:
    """Wall time spent in a function, patched where the engine calls it."""

    def __init__(self, module, name: str) -> None:
        self.module, self.name, self.total = module, name, 0.0
        self.inner = getattr(module, name)

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return self.inner(*args, **kwargs)
            finally:
                self.total += time.perf_counter() - start

        setattr(module, name, timed)

    def restore(self) -> None:
        setattr(self.module, self.name, self.inner)


def run_round(engine: StageEngine, batch: int, tokens: int, schema, tag: str) -> list[float]:
    prompt = [1, 2, 3, 4, 5, 6, 7, 8]
    params = SamplingParams(max_tokens=tokens, ignore_eos=True, json_schema=schema)
    for i in range(batch):
        engine.add_request(StageInput(f"{tag}-{i}", prompt + [9 + i], params))
    times = []
    while engine.has_unfinished:
        start = time.perf_counter()
        engine.step()
        if len(engine.scheduler.running) == batch:
            times.append(time.perf_counter() - start)
    return times[2:] or times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", default="1,8,32")
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    path = model_dir()
    stage = {"name": "llm", "model": path, "engine": {"device": args.device, "block_size": 16}}
    print(f"model: {path}, device {args.device}; {args.tokens} tokens per request, greedy")
    rows = []
    for batch in (int(b) for b in args.batch.split(",")):
        base = None
        for kind, schema in KINDS.items():
            engine = StageEngine(load_config({"stages": [stage]}).stages[0])
            cold = run_round(engine, batch, args.tokens, schema, "cold")
            computed = engine.stats().get("json_masks_computed", 0)
            masks, sample = Timed(JsonCursor, "packed"), Timed(model_runner, "masked")
            steps_before = engine.num_steps
            warm = run_round(engine, batch, args.tokens, schema, "warm")
            masks.restore()
            sample.restore()
            step_ms = statistics.median(warm) * 1e3
            base = base or step_ms
            steps = max(engine.num_steps - steps_before, 1)
            host_us = (masks.total + sample.total) / steps * 1e6
            rows.append([str(batch), kind, f"{statistics.median(cold) * 1e3:.2f}",
                         f"{step_ms:.2f}", f"{step_ms / base:.2f}x", f"{host_us:.0f}",
                         str(computed), str(engine.stats().get("json_masks_computed", 0) - computed)])  # fmt: skip
    table(["B", "constraint", "step ms cold", "step ms warm", "warm vs none",
           "mask host us/step", "masks cold", "masks warm"], rows)  # fmt: skip
    engine = StageEngine(load_config({"stages": [stage]}).stages[0])
    vocab = engine.json._vocabulary()
    constraint = JsonConstraint(compile_schema(SCHEMA), vocab)
    cold = []
    states = (("the reply starts", b""), ("a property's value starts", b'{"name":'),
              ("inside a string", b'{"name": "A'))  # fmt: skip
    for label, text in states:
        state = initial(constraint.root)
        for byte in text:
            state = constraint._step(state, byte)
        start = time.perf_counter()
        constraint.packed(state)
        cold.append([label, f"{(time.perf_counter() - start) * 1e3:.1f}"])
    print(f"\none cold mask over {vocab.vocab_size:,} tokens:")
    table(["state", "ms"], cold)


if __name__ == "__main__":
    main()
