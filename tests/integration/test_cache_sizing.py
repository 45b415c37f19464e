"""KV pool sizing from the memory budget, refusal of pools the machine cannot hold, and no output
cache for a stage whose per-token outputs nobody asked for: on the CPU (host memory), also on a
GPU machine; the GPU's messages are checked in tests/cuda."""

from __future__ import annotations

import pytest
from helpers import make_engine, on_cpu

from omni import Omni, SamplingParams
from omni.config import ConfigError
from omni.engine.cache_sizing import available_memory_bytes

pytestmark = pytest.mark.slow


def test_a_pool_larger_than_the_machine_is_a_config_error(qwen2_dir):
    with pytest.raises(ConfigError) as info:
        make_engine(qwen2_dir, num_blocks=1_000_000_000)
    message = str(info.value)
    assert "stages.llm.engine.num_blocks=1000000000 needs" in message
    assert "bytes are available" in message


def test_num_blocks_from_the_memory_budget(qwen2_dir):
    per_block_engine = make_engine(qwen2_dir, num_blocks=8)
    kv = per_block_engine.runner.kv_caches[0][0]
    num_layers = len(per_block_engine.runner.kv_caches)
    block_bytes = 2 * num_layers * kv[0].numel() * kv.element_size()
    block_bytes += 16 * per_block_engine.model.hidden_size * 4  # hidden_states rows
    budget = 300 * block_bytes + block_bytes // 2
    engine = make_engine(qwen2_dir, kv_cache_memory=budget)
    assert engine.num_blocks == 300 and engine.stats()["num_blocks"] == 300
    capped = make_engine(qwen2_dir, kv_cache_memory=0.5, max_num_seqs=2, max_model_len=64)
    assert capped.num_blocks == 2 * 64 // 16  # no more than max_num_seqs full sequences
    assert available_memory_bytes() > 0
    with pytest.raises(ConfigError, match="one sequence of max_model_len=4096 needs 256"):
        make_engine(qwen2_dir, kv_cache_memory=block_bytes * 10)


def test_a_plain_lm_keeps_no_outputs_unless_asked(qwen2_dir):
    params = SamplingParams(max_tokens=3, ignore_eos=True)
    with Omni(model=qwen2_dir, runtime={"backend": "local"}, **on_cpu("llm")) as llm:
        (plain,) = llm.generate([[5, 6, 7, 8]], params, use_tqdm=False)
        assert llm.config.stage("llm").engine.max_model_len == 4096  # the checkpoint's
        stats = llm.stats()["llm"]
    assert plain.final.tensors == {} and "output_cache_bytes" not in stats
    asked = {"stages.llm.engine.outputs": ["hidden_states"], **on_cpu("llm")}
    with Omni(model=qwen2_dir, runtime={"backend": "local"}, **asked) as llm:
        (out,) = llm.generate([[5, 6, 7, 8]], params, use_tqdm=False)
    assert out.final.token_ids == plain.final.token_ids
    assert out.final.tensors["hidden_states"].shape[0] == 4 + 3 - 1  # every fed token
