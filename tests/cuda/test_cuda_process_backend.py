"""A GPU decoder stage in a process of its own (`runtime.backend: processes`): CUDA graphs and
steps launched ahead there, float32 greedy tokens equal to transformers' on the same GPU, and
the stage process stops cleanly at shutdown."""

from __future__ import annotations

import os

import pytest
import torch
from helpers import shared_prefix_prompts
from transformers import AutoConfig

from omni import Omni
from omni.core.sampling_params import SamplingParams

pytestmark = [pytest.mark.cuda, pytest.mark.slow]


def test_a_gpu_stage_process_equals_transformers(qwen2_dir):
    from test_cuda_engine import hf_greedy

    prompts = shared_prefix_prompts(AutoConfig.from_pretrained(qwen2_dir).vocab_size)[:6]
    expected = hf_greedy(qwen2_dir, prompts, torch.float32)
    engine = {
        "device": "cuda", "dtype": "float32", "block_size": 4, "max_num_seqs": 6,
        "num_blocks": 2048, "cuda_graphs": True, "async_scheduling": True,
    }  # fmt: skip
    overrides = {f"stages.llm.engine.{key}": value for key, value in engine.items()}
    omni = Omni(model=qwen2_dir, runtime={"backend": "processes"}, **overrides)
    try:
        process = omni.backend.stages["llm"].process
        params = SamplingParams(max_tokens=len(expected[0]), ignore_eos=True)
        got = [o.final.token_ids for o in omni.generate(prompts, params, use_tqdm=False)]
        assert got == expected
        stats = omni.stats()["llm"]
        assert stats["pid"] == process.pid != os.getpid()
        assert stats["device"] == "cuda:0" and stats["graph_steps"] > 0, stats
        assert stats["steps_launched_ahead"] > 0, stats
    finally:
        omni.shutdown()
    assert process.exitcode == 0
