"""GPU stage planning before anything loads (omni/config/devices.py): which stages are on a GPU,
their memory shares, and the ConfigErrors for requests that cannot hold."""

from __future__ import annotations

import pytest

from omni.config import ConfigError, load_config
from omni.config.devices import plan_gpus


def _config(backend: str, **stages: dict) -> object:
    return load_config(
        {
            "runtime": {"backend": backend},
            "stages": [
                {"name": "a", "model": "m"},
                {"name": "b", "model": "m", "inputs": ["a"], "input_processor": "join"},
                {"name": "c", "model": "m", "inputs": ["b"], "input_processor": "join"},
            ],
        },
        check_models=False,
        overrides={f"stages.{k}": v for k, v in stages.items()},
    )


def _shares(config) -> dict:
    return {s.name: s.engine.gpu_memory_utilization for s in config.stages}


def test_local_stages_split_one_gpu(join_processor):
    config = _config("local", **{"a.engine.gpu_memory_utilization": 0.5})
    planned = plan_gpus(config, cuda_available=True, what="-")
    assert _shares(planned) == pytest.approx({"a": 0.5, "b": 0.2, "c": 0.2})
    cpu_only = plan_gpus(_config("local"), cuda_available=False, what="-")
    assert _shares(cpu_only) == {"a": None, "b": None, "c": None}  # auto: all on the CPU


def test_local_shares_above_one_or_cuda_without_a_gpu_are_refused(join_processor):
    over = _config(
        "local", **{"a.engine.gpu_memory_utilization": 0.7, "b.engine.gpu_memory_utilization": 0.4}
    )
    with pytest.raises(ConfigError, match=r"sum to 1.1 > 1 \(a=0.7, b=0.4\)"):
        plan_gpus(over, cuda_available=True, what="-")
    with pytest.raises(ConfigError, match="stages.b.engine.device: is cuda, but no GPU here"):
        plan_gpus(
            _config("local", **{"b.engine.device": "cuda"}),
            cuda_available=False,
            what="no GPU here",
        )


def test_ray_shares_follow_the_reserved_fraction(join_processor):
    config = _config(
        "ray",
        **{
            "a.resources.num_gpus": 0.8,
            "b.resources.num_gpus": 1,
            "c.resources.num_gpus": 0.15,
            "c.engine.gpu_memory_utilization": 0.1,
        },
    )
    planned = plan_gpus(config, cuda_available=True, what="-")
    assert _shares(planned) == pytest.approx({"a": 0.8, "b": 0.9, "c": 0.1})
    cpu_stage = _config("ray", **{"a.engine.device": "cpu", "a.resources.num_gpus": 1})
    assert _shares(plan_gpus(cpu_stage, cuda_available=True, what="-"))["a"] is None
