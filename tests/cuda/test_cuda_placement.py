"""Where stages land on a GPU machine with no device settings (the plan, omni/config/devices.py),
and loading onto the GPU without accelerate. Needs a GPU (`cuda` marker)."""

from __future__ import annotations

import sys

import pytest
import torch

from omni import Omni
from omni.entrypoints.cli import machine_gpus
from stages.causal_lm import CausalLMAdapter

pytestmark = [pytest.mark.cuda, pytest.mark.slow]

CUDA = torch.device("cuda", 0)


def test_causal_lm_loads_onto_the_gpu_without_accelerate(qwen2_dir, monkeypatch):
    on_cpu = CausalLMAdapter(qwen2_dir, dtype=torch.float32, device="cpu")
    monkeypatch.setitem(sys.modules, "accelerate", None)  # `import accelerate` now fails
    on_gpu = CausalLMAdapter(qwen2_dir, dtype=torch.float32, device=CUDA)
    for (name, got), want in zip(
        on_gpu.model.state_dict().items(), on_cpu.model.state_dict().values(), strict=True
    ):
        assert got.device == CUDA, name
        assert torch.equal(got.cpu(), want), name


def test_omni_model_dir_runs_on_the_gpu_without_yaml_edits(qwen2_dir):
    with Omni(model=qwen2_dir, runtime={"backend": "local"}) as omni:  # num_gpus null: planned
        (out,) = omni.generate([[5, 6, 7]], use_tqdm=False)
        assert out.error is None
        stats = omni.stats()["llm"]
        assert (stats["device"], stats["dtype"]) == ("cuda:0", "bfloat16")
    cpu = {"stages.llm.resources.num_gpus": 0}
    with Omni(model=qwen2_dir, runtime={"backend": "local"}, **cpu) as omni:
        stats = omni.stats()["llm"]
        assert (stats["device"], stats["dtype"]) == ("cpu", "float32")


def test_validate_counts_the_gpus_torch_sees():
    assert machine_gpus() == torch.cuda.device_count()
