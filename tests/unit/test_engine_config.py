"""EngineConfig's device-dependent defaults (omni/config/engine_config.py), resolved without a
GPU: what a null max_num_batched_tokens means per stage kind and device."""

from __future__ import annotations

from pathlib import Path

import pytest

from omni.config import load_config
from omni.config.engine_config import EngineConfig


def test_a_null_step_budget_is_2048_tokens_for_an_ar_stage_on_any_device():
    engine = EngineConfig()
    assert engine.max_num_batched_tokens is None
    assert engine.resolved_max_num_batched_tokens() == 2048
    assert engine.resolved_max_num_batched_tokens(generation=False, on_gpu=True) == 2048


def test_a_null_code_budget_bounds_a_generation_step_on_the_cpu_only():
    """256 codes on the CPU (a step there holds back the stages sharing its thread); on a GPU
    only max_num_seqs bounds a batch of chunks."""
    engine = EngineConfig()
    assert engine.resolved_max_num_batched_tokens(generation=True, on_gpu=False) == 256
    assert engine.resolved_max_num_batched_tokens(generation=True, on_gpu=True) >= 1 << 20


@pytest.mark.parametrize("generation", [False, True])
@pytest.mark.parametrize("on_gpu", [False, True])
def test_a_set_budget_is_kept_everywhere(generation, on_gpu):
    engine = EngineConfig(max_num_batched_tokens=300)
    assert engine.resolved_max_num_batched_tokens(generation, on_gpu) == 300


def test_the_shipped_vocoder_leaves_its_budget_to_the_device(omni_dir):
    yaml = Path(__file__).resolve().parents[2] / "stage_configs" / "qwen2_5_omni.yaml"
    config = load_config(yaml, None, {"MODEL": omni_dir})
    assert config.stage("token2wav").engine.max_num_batched_tokens is None
    with pytest.raises(ValueError, match="max_num_batched_tokens: must be an integer >= 1 or null"):
        EngineConfig(max_num_batched_tokens=0)
