"""GPU requests that cannot hold are refused by Omni before any model loads (local backend), on a
machine without a GPU: torch is told it sees none (`no_gpu`), so these run the same on a GPU
machine (tests/cuda has the GPU side)."""

from __future__ import annotations

import time

import pytest
import torch

from omni import Omni
from omni.config import ConfigError


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.mark.usefixtures("no_gpu")
def test_cuda_stage_without_a_gpu_is_a_config_error(qwen2_dir):
    started = time.monotonic()
    with pytest.raises(ConfigError) as caught:
        Omni(model=qwen2_dir, runtime={"backend": "local"}, **{"stages.llm.engine.device": "cuda"})
    message = str(caught.value)
    assert "engine.device: is cuda, but torch sees no CUDA GPU on this machine" in message
    assert time.monotonic() - started < 10  # refused before the weights load


@pytest.mark.usefixtures("no_gpu")
def test_device_cpu_and_auto_run_on_the_cpu_here(qwen2_dir):
    for device in ("cpu", "auto"):
        with Omni(
            model=qwen2_dir, runtime={"backend": "local"}, **{"stages.llm.engine.device": device}
        ) as omni:
            (out,) = omni.generate([[5, 6, 7]], use_tqdm=False)
            assert out.error is None and len(out.final.token_ids) > 0
            assert omni.stats()["llm"]["device"] == "cpu", device
