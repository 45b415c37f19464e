"""Shared test helpers: reference generation with transformers, engines from tiny checkpoints,
and the overrides that keep a test on the CPU.

Tests that compare with a CPU float32 reference (transformers, or another run of ours on the CPU)
pin their stages to the CPU: with `engine.device: auto` they would run on a GPU wherever one is
(in bfloat16 unless the config says float32) and compare numbers the reference never made. Their
GPU twins are in tests/cuda.
"""

from __future__ import annotations

import dataclasses
import io
import os
import random
import wave
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import AutoModelForCausalLM, GenerationConfig

from omni.config import StageConfig, load_config
from omni.core.sampling_params import SamplingParams
from omni.engine import StageEngine
from omni.messages import StageInput


def shared_prefix_prompts(vocab_size: int, num_prompts: int = 12, seed: int = 0) -> list[list[int]]:
    """Prompts of varied lengths (5..120 tokens) built from three shared prefixes."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(3, vocab_size) for _ in range(n)] for n in (37, 64, 9)]
    prompts = []
    for i in range(num_prompts):
        prefix = prefixes[i % 3][: rng.choice([0, 5, 16, 40, 64])]
        suffix = [rng.randrange(3, vocab_size) for _ in range(rng.randrange(1, 57))]
        prompts.append(prefix + suffix)
    prompts.append(prompts[0][:])  # an exact repeat
    return prompts


def transformers_greedy(
    model_dir: str,
    prompts: list[list[int]],
    max_new_tokens: int,
    processor: Callable[[list[int]], Any] | None = None,
) -> list[list[int]]:
    """transformers' greedy generate of each prompt; processor: a prompt's extra LogitsProcessor
    (e.g. an oracle's penalties)."""
    model = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, attn_implementation="sdpa"
    ).eval()
    # No EOS stop: both sides generate exactly max_new_tokens (ours with ignore_eos=True).
    model.generation_config.eos_token_id = None
    config = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=0)
    outputs = []
    with torch.inference_mode():
        for prompt in prompts:
            ids = torch.tensor([prompt])
            extra = {"logits_processor": [processor(prompt)]} if processor is not None else {}
            out = model.generate(
                ids, attention_mask=torch.ones_like(ids), generation_config=config, **extra
            )
            outputs.append(out[0, len(prompt) :].tolist())
    return outputs


OMNI_STAGES = ("thinker", "talker", "token2wav")
"""The stages of the shipped qwen2_5_omni.yaml (what `Omni(model=omni_dir)` loads)."""


def on_cpu(*stages: str) -> dict[str, str]:
    """Config overrides pinning the named stages to the CPU (`engine.device: cpu`)."""
    return {f"stages.{name}.engine.device": "cpu" for name in stages}


OMNI_ON_CPU = on_cpu(*OMNI_STAGES)
"""`Omni(model=omni_dir, **OMNI_ON_CPU)`: the whole tiny Qwen2.5-Omni pipeline on the CPU."""


def python_path(*first: str | Path, leave_out: str | Path | None = None) -> str:
    """A subprocess's PYTHONPATH: `first` ahead of this process's own entries, which stay (a
    machine may keep dependencies there, as the GPU machine keeps its wheels), but `leave_out`."""
    outer = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if leave_out is not None:
        outer = [p for p in outer if Path(p).resolve() != Path(leave_out).resolve()]
    return os.pathsep.join([*map(str, first), *outer])


def cli_sets(overrides: dict[str, object]) -> list[str]:
    """The same overrides as `--set KEY=VALUE` arguments of `omni run` and `omni serve`."""
    return [arg for key, value in overrides.items() for arg in ("--set", f"{key}={value}")]


def make_engine(model_dir: str, **engine: object) -> StageEngine:
    """A one-stage engine on the CPU unless `device` is given (see the module docstring) that
    keeps every per-token output its model emits (outputs=None), unless `outputs` is given:
    these tests look at the output cache."""
    engine.setdefault("device", "cpu")
    config = load_config({"stages": [{"name": "llm", "model": model_dir, "engine": dict(engine)}]})
    return StageEngine(
        all_outputs(config.stages[0]) if "outputs" not in engine else config.stages[0]
    )


def all_outputs(stage: StageConfig) -> StageConfig:
    """The stage keeping every output its model emits (a final stage keeps none by default)."""
    return dataclasses.replace(stage, engine=dataclasses.replace(stage.engine, outputs=None))


def run_engine(
    engine: StageEngine, prompts: list[list[int]], params: SamplingParams, prefix: str = "r"
):
    for i, prompt in enumerate(prompts):
        engine.add_request(StageInput(f"{prefix}{i}", prompt, params))
    results = {r.request_id: r for r in engine.run_until_done()}
    return [results[f"{prefix}{i}"] for i in range(len(prompts))]


class FakeGpu:
    """A GPU allocator as plain numbers, for the KV-sizing wiring without a GPU: its `readings()`
    stand in for torch.cuda's (omni.engine.gpu_profile.GpuReadings). A profiled step takes
    `step_bytes` on top of what is allocated (e.g. its temporary KV pool), and `hold(n)` records
    n more bytes held for a moment on top of those (a test model's forward); `reserved` is what
    the allocator holds (a trial capture of CUDA graphs raises it while they are held)."""

    def __init__(self, *, allocated: int, total: int, free: int, step_bytes: int = 0) -> None:
        self.allocated, self.total, self.free, self.step_bytes = allocated, total, free, step_bytes
        self.peak = allocated
        self.reserved = allocated
        self.num_releases = 0

    def hold(self, num_bytes: int) -> None:
        self.peak = max(self.peak, self.allocated + self.step_bytes + num_bytes)

    def readings(self):
        from omni.engine.gpu_profile import GpuReadings

        def reset_peak() -> None:
            self.peak = self.allocated + self.step_bytes

        def release() -> None:
            self.num_releases += 1

        return GpuReadings(
            allocated=lambda: self.allocated,
            max_allocated=lambda: self.peak,
            reserved=lambda: self.reserved,
            reset_peak=reset_peak,
            release=release,
            mem_info=lambda: (self.free, self.total),
        )


def wav_bytes(samples: np.ndarray, rate: int = 16000, channels: int = 1) -> bytes:
    """int16 samples ([frames] or interleaved [frames * channels]) as a 16-bit WAV file."""
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(samples.astype("<i2").tobytes())
    return buffer.getvalue()
