"""`make demo`: Qwen2.5-Omni (thinker -> talker -> token2wav) on a local Ray instance: an image
and a long question sent twice; the answer's text, a WAV file, timings and per-stage cache
statistics (the second request is served from the caches). `--two-stage` runs the generic
two-stage pipeline instead:

Stage `a` (a tiny Qwen2-style causal LM) reads the prompt and generates; its per-token hidden
states go, actor to actor through Ray's object store, to stage `b` (a tiny Llama-style causal LM)
as prompt embeddings (stages/two_stage.py), and `b` generates the answer. The second time, both
stages find the prompt in their prefix caches: `a` serves its hidden-state rows from its output
cache instead of recomputing them, and `b` reuses the KV blocks of the same token prefix.

The checkpoints are tiny random-weight models built offline (tools/make_tiny_checkpoint.py), so
the text is gibberish; the point is the data flow, the timings and the cache statistics.

To extend (e.g. the Qwen2.5-Omni demo): write another `Scenario` (a config and its prompts) and
pass it to `run`; the reporting is generic over stages.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # tools/ is not an installed package
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault(
    "TRANSFORMERS_VERBOSITY", "error"
)  # config-range notes about tiny checkpoints

DOCUMENT = (
    "Prefix caching keeps the key and value blocks of every prompt a stage has seen, indexed by "
    "a hash of the block's tokens chained with the hash of the block before it. A new request "
    "looks up its longest cached prefix and computes only the rest. In a multi-stage pipeline "
    "each stage also keeps its per-token outputs beside the blocks, so a cached prefix returns "
    "the hidden states the next stage needs without running the model again. "
)
QUESTION = "Question: what does the second request of the same document skip? Answer:"


@dataclass
class Scenario:
    title: str
    config: Any  # an OmniConfig
    prompts: list[Any]  # sent one after another, each as its own generate() call
    sampling_params: Any = None  # None: each stage's config defaults
    wav_path: str | None = None  # where to write the final stage's audio, if any


def omni_scenario() -> Scenario:
    import numpy as np
    from PIL import Image

    from omni.config import config_for_model
    from omni.core.sampling_params import SamplingParams
    from tools.make_tiny_checkpoint import ensure_checkpoint

    model_dir = ensure_checkpoint("qwen2_5_omni", "tiny", 0)
    config = config_for_model(model_dir)
    # A synthetic test card: colour gradients, no files or downloads needed.
    pixels = np.zeros((112, 168, 3), dtype=np.uint8)
    pixels[..., 0] = np.linspace(0, 255, 168, dtype=np.uint8)
    pixels[..., 1] = np.linspace(255, 0, 112, dtype=np.uint8)[:, None]
    pixels[40:72, 60:108, 2] = 255
    prompt = {
        "prompt": DOCUMENT * 4 + "Look at the picture: which colours are in it?",
        "images": [Image.fromarray(pixels)],
    }
    params = [
        SamplingParams(max_tokens=16),  # thinker
        SamplingParams(max_tokens=48, stop_token_ids=(8292, 8294)),  # talker: codec EOS ids
        SamplingParams(max_tokens=1, seed=0),  # token2wav: the DiT noise seed
    ]
    return Scenario(
        "Qwen2.5-Omni (tiny random weights): thinker -> talker -> token2wav",
        config,
        [prompt, prompt],
        params,
        str(REPO / "out" / "demo_answer.wav"),
    )


def two_stage_scenario() -> Scenario:
    from omni.config import load_config
    from tools.make_tiny_checkpoint import ensure_checkpoint

    variables = {
        "MODEL_A": str(ensure_checkpoint("qwen2", "tiny", 0)),
        "MODEL_B": str(ensure_checkpoint("llama", "tiny", 0)),
    }
    config = load_config(REPO / "stage_configs" / "tiny_two_stage.yaml", None, variables)
    prompt = DOCUMENT * 6 + QUESTION
    return Scenario("two-stage pipeline (a: qwen2-tiny -> b: llama-tiny)", config, [prompt, prompt])


def run(scenario: Scenario) -> None:
    from omni.audio import write_wav
    from omni.entrypoints.omni import Omni

    print(f"== {scenario.title}")
    start = time.perf_counter()
    with Omni(scenario.config) as omni:
        session = getattr(omni.backend, "session", None)
        where = f"Ray ({session.mode})" if session is not None else "in-process"
        print(
            f"started {len(omni.order)} stage(s) on {where} in {time.perf_counter() - start:.1f} s"
        )
        previous: dict[str, dict] = {name: {} for name in omni.order}
        outputs = []
        for index, prompt in enumerate(scenario.prompts, 1):
            t0 = time.perf_counter()
            (output,) = omni.generate(prompt, scenario.sampling_params, use_tqdm=False)
            wall = time.perf_counter() - t0
            outputs.append(output)
            if output.error:
                raise SystemExit(f"request {index} failed: {output.error}")
            print(f"\n-- request {index}: {wall:.2f} s end to end")
            for name in omni.order:
                r = output.stages[name]
                rows = {k: tuple(v.shape) for k, v in r.tensors.items()}
                print(
                    f"  [{name}] {r.num_prompt_tokens} prompt tokens, {r.num_cached_tokens} "
                    f"from the prefix cache, {len(r.token_ids)} generated in "
                    f"{r.timings.get('latency_s', 0.0):.2f} s; tensors {rows}"
                )
            texts = {n: r.text for n, r in output.stages.items() if r.text is not None}
            print(f"  text: {texts}")
            if output.final.audio is not None and scenario.wav_path:
                seconds = write_wav(scenario.wav_path, output.final.audio, output.final.sample_rate)
                print(
                    f"  audio: {seconds:.2f} s at {output.final.sample_rate} Hz -> {scenario.wav_path}"
                )
            stats = omni.stats()
            for name in omni.order:
                print("  " + _cache_line(name, stats[name], previous[name]))
            previous = stats
        same = all(o.final.token_ids == outputs[0].final.token_ids for o in outputs)
        print(f"\nall requests gave the same final tokens: {same}")
    print(f"done in {time.perf_counter() - start:.1f} s (shutdown included)")


def _cache_line(name: str, now: dict, before: dict) -> str:
    def delta(key: str) -> float:
        return now.get(key, 0) - before.get(key, 0)

    queried, hits = delta("kv_queried_tokens"), delta("kv_hit_tokens")
    rate = hits / queried if queried else 0.0
    return (
        f"[{name}] cache this request: {int(hits)}/{int(queried)} prompt tokens hit "
        f"({rate:.0%}), {int(delta('output_hit_rows'))} output rows served from the output "
        f"cache, {int(delta('steps'))} engine steps"
    )


if __name__ == "__main__":
    run(two_stage_scenario() if "--two-stage" in sys.argv[1:] else omni_scenario())
