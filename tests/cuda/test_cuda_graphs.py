"""CUDA-graph decode steps on a GPU: replayed steps give transformers' float32 tokens (also under
preemption), the same rows as eager steps in the output cache (graph outputs are overwritten in
place by the next replay, so the asynchronous copies must be ordered before it), one graph
launch per decode step, and bfloat16 agreement with the eager engine (printed).

Run with `pytest -q tests/cuda -s`; skipped where torch sees no GPU (tests/conftest.py)."""

from __future__ import annotations

import pytest
import torch
from helpers import make_engine, run_engine, shared_prefix_prompts
from transformers import AutoConfig

from kernels.split_kv import num_sms
from omni.core.sampling_params import SamplingParams
from omni.messages import StageInput
from omni.runtime.graph_shapes import batch_ladder, splits_keys, suffix_ladder

pytestmark = [pytest.mark.cuda, pytest.mark.slow]

MAX_NEW = 16
GREEDY = SamplingParams(max_tokens=MAX_NEW, ignore_eos=True)
FP32 = {"device": "cuda", "dtype": "float32", "block_size": 4}
CONFIGS = {
    "ladder-6": {"num_blocks": 2048, "max_num_seqs": 6},
    "ladder-32": {"num_blocks": 2048},
    "tiny-pool": {"num_blocks": 48, "max_model_len": 192, "max_num_seqs": 6},
}


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def family(request, qwen2_dir, llama_dir):
    from test_cuda_engine import hf_greedy

    model_dir = qwen2_dir if request.param == "qwen2" else llama_dir
    prompts = shared_prefix_prompts(AutoConfig.from_pretrained(model_dir).vocab_size)
    return model_dir, prompts, hf_greedy(model_dir, prompts, torch.float32)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_graph_replay_equals_transformers_and_eager(family, name):
    model_dir, prompts, expected = family
    graphs = make_engine(model_dir, **FP32, **CONFIGS[name])
    eager = make_engine(model_dir, **FP32, **CONFIGS[name], cuda_graphs=False)
    assert graphs.runner.decode_graphs is not None and eager.runner.decode_graphs is None
    got = run_engine(graphs, prompts, GREEDY)
    plain = run_engine(eager, prompts, GREEDY)
    for index, (ours, base, want) in enumerate(zip(got, plain, expected, strict=True)):
        assert ours.token_ids == want, f"{name}: prompt {index}"
        assert base.token_ids == want, f"{name}: prompt {index} (eager)"
        # Rows a replay wrote went down to the pinned cache before the next replay overwrote them.
        torch.testing.assert_close(
            ours.tensors["hidden_states"], base.tensors["hidden_states"], rtol=1e-4, atol=1e-4
        )
    stats = graphs.stats()
    engine = graphs.config.engine
    max_suffix = min(engine.resolved_max_num_batched_tokens(), engine.max_model_len or 4096)
    num_shapes = len(batch_ladder(engine.graph_batch_limit)) + len(suffix_ladder(max_suffix))
    # Plus a long-context graph (keys split) for each shape whose grid would split.
    decode_graphs = graphs.runner.decode_graphs
    kv_heads, sms = decode_graphs.kv_caches[0][0].shape[2], num_sms(decode_graphs.device)
    bound = decode_graphs.bound
    num_long = sum(splits_keys(s, bound, kv_heads, sms) for s in decode_graphs.shapes)
    assert (num_long > 0) == (bound > 511), (bound, num_long)
    assert stats["cuda_graphs"] == num_shapes + num_long, stats
    assert stats["graph_steps"] > 0, stats
    if name == "ladder-32":  # 13 requests decode in the bucket of 16
        assert stats["padded_rows"] > 0, stats
    assert stats["cuda_graph_capture_s"] > 0, stats
    if name == "tiny-pool":
        assert stats["preemptions"] > 0, stats


def test_one_graph_launch_per_decode_step(qwen2_dir):
    from torch.profiler import ProfilerActivity, profile

    engine = make_engine(qwen2_dir, **FP32, num_blocks=512, max_num_seqs=8)
    for i in range(8):
        engine.add_request(StageInput(f"r{i}", [5 + i] * (10 + i), GREEDY))
    engine.step()  # the prefill
    engine.step()  # a first decode step (warm)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        engine.step()
    names = [e.name for e in prof.events()]
    launches = sum(n in ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx") for n in names)
    print(
        f"\none decode step of 8: {names.count('cudaGraphLaunch')} graph launch, {launches} "
        "other kernel launches (logits, sampler, output cache)"
    )
    assert names.count("cudaGraphLaunch") == 1
    assert engine.stats()["graph_steps"] == 2


def test_bfloat16_graphs_agree_with_eager(qwen2_dir):
    prompts = shared_prefix_prompts(AutoConfig.from_pretrained(qwen2_dir).vocab_size)
    config = {"device": "cuda", "dtype": "bfloat16", "block_size": 4, "num_blocks": 2048}
    got = run_engine(make_engine(qwen2_dir, **config), prompts, GREEDY)
    base = run_engine(make_engine(qwen2_dir, **config, cuda_graphs=False), prompts, GREEDY)
    same = sum(
        a == b
        for r, s in zip(got, base, strict=True)
        for a, b in zip(r.token_ids, s.token_ids, strict=True)
    )
    share = same / (len(prompts) * MAX_NEW)
    print(f"\nbfloat16 graph vs eager: {share:.1%} of tokens equal")
    assert share > 0.5  # padding changes GEMM shapes, so bf16 rounding may differ; not chance
