"""Shared by the two-stage pipeline tests: the config, prompts, a direct-engine reference run and
result comparison."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import torch
from helpers import on_cpu

from omni.config import OmniConfig, load_config
from omni.engine import StageEngine
from omni.messages import PromptInput, StageInput, StageResult
from omni.registry import get_input_processor

REPO = Path(__file__).resolve().parents[2]
YAML = REPO / "stage_configs" / "tiny_two_stage.yaml"


def two_stage_config(a_dir: str, b_dir: str, **overrides: object) -> OmniConfig:
    """tiny_two_stage.yaml with block size 4 (more prefix hits on short prompts), 6 tokens/stage,
    both stages on the CPU (runs are compared with `direct_run` and with each other)."""
    base: dict[str, object] = {
        **on_cpu("a", "b"),
        "runtime.log_level": "WARNING",
        "runtime.return_tensors": "all",  # compared stage by stage, tensors included
        "stages.a.engine.block_size": 4,
        "stages.b.engine.block_size": 4,
        "stages.a.sampling.max_tokens": 6,
        "stages.b.sampling.max_tokens": 6,
    }
    return load_config(YAML, {**base, **overrides}, {"MODEL_A": a_dir, "MODEL_B": b_dir})


def prompts(n: int = 5, seed: int = 0) -> list[list[int]]:
    """Token-id prompts (5..40 tokens) sharing a 12-token prefix, plus an exact repeat."""
    rng = random.Random(seed)
    prefix = [rng.randrange(3, 500) for _ in range(12)]
    out = [prefix + [rng.randrange(3, 500) for _ in range(rng.randrange(1, 28))] for _ in range(n)]
    out.append(list(out[0]))
    return out


def direct_run(config: OmniConfig, prompt_ids: list[list[int]]) -> list[dict[str, StageResult]]:
    """The pipeline by hand: stage a's engine, the edge's processor, stage b's engine."""
    a_cfg, b_cfg = config.stage("a"), config.stage("b")
    engine_a = StageEngine(a_cfg)
    for i, ids in enumerate(prompt_ids):
        engine_a.add_request(StageInput(f"r{i}", ids, a_cfg.sampling))
    got_a = {r.request_id: r for r in engine_a.run_until_done()}
    engine_b = StageEngine(b_cfg)
    processor = get_input_processor(b_cfg.input_processor)
    for i, ids in enumerate(prompt_ids):
        stage_input = processor({"a": got_a[f"r{i}"]}, PromptInput(f"r{i}", ids))
        engine_b.add_request(dataclasses.replace(stage_input, sampling_params=b_cfg.sampling))
    got_b = {r.request_id: r for r in engine_b.run_until_done()}
    return [{"a": got_a[f"r{i}"], "b": got_b[f"r{i}"]} for i in range(len(prompt_ids))]


def assert_same(got: dict[str, StageResult], want: dict[str, StageResult], where: str) -> None:
    """Same tokens; same per-token tensors (float32, up to batching-order rounding)."""
    for stage, expected in want.items():
        result = got[stage]
        assert result.error is None, f"{where}/{stage}: {result.error}"
        assert result.token_ids == expected.token_ids, f"{where}/{stage}: tokens differ"
        assert result.prompt_token_ids == expected.prompt_token_ids, f"{where}/{stage}"
        assert set(result.tensors) == set(expected.tensors), f"{where}/{stage}"
        for name, tensor in expected.tensors.items():
            assert result.tensors[name].shape == tensor.shape, f"{where}/{stage}/{name}"
            torch.testing.assert_close(result.tensors[name], tensor, atol=1e-5, rtol=1e-5)
