"""GPU requests that cannot hold are refused by Omni before any model loads (local backend)."""

from __future__ import annotations

import time

import pytest
import torch

from omni import Omni
from omni.config import ConfigError


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA"
)
def test_cuda_stage_without_a_gpu_is_a_config_error(qwen2_dir):
    started = time.monotonic()
    with pytest.raises(ConfigError) as caught:
        Omni(model=qwen2_dir, runtime={"backend": "local"}, **{"stages.llm.engine.device": "cuda"})
    message = str(caught.value)
    assert "engine.device: is cuda, but torch sees no CUDA GPU on this machine" in message
    assert time.monotonic() - started < 10  # refused before the weights load


def test_device_cpu_and_auto_run_on_the_cpu_here(qwen2_dir):
    for device in ("cpu", "auto"):
        with Omni(
            model=qwen2_dir, runtime={"backend": "local"}, **{"stages.llm.engine.device": device}
        ) as omni:
            (out,) = omni.generate([[5, 6, 7]], use_tqdm=False)
            assert out.error is None and len(out.final.token_ids) > 0
