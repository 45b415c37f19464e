"""A GPU stage's KV pool size, on a machine without a GPU: the arithmetic of
omni/engine/cache_sizing.py and its errors, and the engine's sizing wiring
(omni/engine/stage_memory.py) with the allocator's readings injected (`FakeGpu`). The same sizing
on a real GPU is in tests/cuda/ (skipped without one)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from helpers import FakeGpu, make_engine

from omni.config import ConfigError, load_config
from omni.engine import StageEngine, stage_memory
from omni.engine.cache_sizing import (
    check_gpu_num_blocks,
    gpu_blocks_that_fit,
    gpu_memory_utilization,
    gpu_num_blocks,
)
from omni.engine.graph_plan import trial_capture
from omni.runtime.model_runner import ModelRunner

GiB = 1 << 30
MiB = 1 << 20


def _stage(**engine: object):
    """A stage config without a checkpoint behind it (for the pure functions)."""
    return load_config(
        {"stages": [{"name": "llm", "model": "m", "engine": engine}]}, check_models=False
    ).stages[0]


def test_gpu_blocks_that_fit():
    # 80 GiB, 90 % of it, 20 GiB of weights + activations, 2 MiB blocks.
    fit = gpu_blocks_that_fit(
        total_bytes=80 * GiB, peak_bytes=20 * GiB, utilization=0.9, block_bytes=2 * MiB
    )
    assert fit == (int(0.9 * 80 * GiB) - 20 * GiB) // (2 * MiB) == 26_624
    assert (
        gpu_blocks_that_fit(total_bytes=GiB, peak_bytes=2 * GiB, utilization=1.0, block_bytes=1)
        == 0
    )
    with pytest.raises(ValueError):
        gpu_blocks_that_fit(total_bytes=GiB, peak_bytes=0, utilization=1.0, block_bytes=0)


def test_gpu_num_blocks_and_its_errors():
    stage = _stage(block_size=16, max_num_batched_tokens=512, max_num_seqs=1024)
    common = dict(total_bytes=40 * GiB, utilization=0.5, block_bytes=MiB, max_model_len=1024)
    blocks = gpu_num_blocks(stage, peak_bytes=4 * GiB, **common)
    assert blocks == (20 * GiB - 4 * GiB) // MiB == 16_384
    # As on the CPU, no more than max_num_seqs sequences of max_model_len (64 blocks each).
    capped = gpu_num_blocks(_stage(block_size=16), peak_bytes=4 * GiB, **common)
    assert capped == 32 * 64
    # Not one sequence of max_model_len (64 blocks) fits: refused with the bytes.
    with pytest.raises(ConfigError) as caught:
        gpu_num_blocks(stage, peak_bytes=20 * GiB - 10 * MiB, **common)
    message = str(caught.value)
    assert message.startswith("stage 'llm': stages.llm.engine.gpu_memory_utilization=0.5 of")
    assert f"{40 * GiB:,} bytes" in message and f"{20 * GiB - 10 * MiB:,}" in message
    assert "max_num_batched_tokens=512" in message and "needs 64" in message
    # The output cache in host memory: kv_cache_memory of the host bounds the pool.
    host = gpu_num_blocks(
        stage, peak_bytes=4 * GiB, host_block_bytes=MiB // 4, host_available_bytes=8 * GiB, **common
    )
    assert host == int(0.1 * 8 * GiB) // (MiB // 4) == 3276
    with pytest.raises(ConfigError, match="kv_cache_memory=0.1 of 268,435,456 bytes of host"):
        gpu_num_blocks(
            stage,
            peak_bytes=4 * GiB,
            host_block_bytes=MiB,
            host_available_bytes=256 * MiB,
            **common,
        )


def test_explicit_num_blocks_on_a_gpu_is_checked_against_free_memory():
    stage = _stage(num_blocks=1000)
    assert check_gpu_num_blocks(stage, num_blocks=1000, free_bytes=GiB, block_bytes=MiB) == 1000
    with pytest.raises(ConfigError, match=r"num_blocks=1000 needs 1,048,576,000 bytes of GPU"):
        check_gpu_num_blocks(stage, num_blocks=1000, free_bytes=GiB // 2, block_bytes=MiB)
    with pytest.raises(ConfigError, match="bytes of host memory for the output cache"):
        check_gpu_num_blocks(
            stage,
            num_blocks=1000,
            free_bytes=GiB,
            block_bytes=MiB,
            host_block_bytes=MiB,
            host_available_bytes=GiB // 2,
        )


def test_explicit_num_blocks_on_a_gpu_must_fit_in_the_stage_share():
    """Free memory alone is not enough: Ray actors starting at once on one GPU all read the same
    free memory; within their shares (summing to at most 0.95) they cannot collide."""
    stage = _stage(num_blocks=1000, gpu_memory_utilization=0.3)
    fits = dict(num_blocks=1000, free_bytes=8 * GiB, block_bytes=MiB)
    assert check_gpu_num_blocks(stage, **fits, share=(0.3, 8 * GiB, GiB)) == 1000
    with pytest.raises(ConfigError) as caught:
        check_gpu_num_blocks(stage, **fits, share=(0.3, 8 * GiB, 2 * GiB))  # 2 + 0.98 > 2.4
    message = str(caught.value)
    assert "stages.llm.engine.num_blocks=1000 needs 1,048,576,000 bytes" in message
    assert "gpu_memory_utilization=0.3 of 8,589,934,592 bytes (2,576,980,377)" in message


def test_gpu_memory_utilization_defaults():
    assert gpu_memory_utilization(_stage(gpu_memory_utilization=0.3)) == 0.3
    assert gpu_memory_utilization(_stage()) == 0.9
    half = load_config(
        {"stages": [{"name": "a", "model": "m", "resources": {"num_gpus": 0.5}}]},
        check_models=False,
    ).stages[0]
    assert gpu_memory_utilization(half) == 0.45  # 0.9 of its fraction, as the plan gives


@pytest.mark.slow
def test_engine_gpu_sizing_wiring_with_injected_numbers(qwen2_dir):
    """stage_memory.gpu_pool_num_blocks on the CPU with the allocator's readings injected (the
    profiled step runs for real): the stage's own weights against its baseline, the KV always
    on the GPU, output rows only with output_cache_device cuda (else on the host), and an
    explicit num_blocks checked against the free bytes less a step's activations."""
    engine = make_engine(qwen2_dir, block_size=16, max_model_len=256, max_num_seqs=64)
    model = engine.model
    kv = model.num_layers * 2 * model.num_kv_heads * model.head_dim * 4 * 16
    rows = model.hidden_size * 4 * 16  # one output (hidden_states), float32
    # Earlier stages hold 5 GiB; this one's weights 1 MiB; its step 2 MiB of activations on
    # top of the temporary pool of min(2048, max_model_len) = 256 tokens (16 blocks).
    gpu = FakeGpu(allocated=5 * GiB + MiB, total=10 * GiB, free=GiB, step_bytes=16 * kv + 2 * MiB)
    counts = {}

    def gpu_pool_num_blocks(output_cache_device: str) -> int:
        return stage_memory.gpu_pool_num_blocks(
            engine.config,
            model,
            device=engine.device,
            max_model_len=engine.max_model_len,
            num_outputs=1,
            itemsize=4,
            output_cache_device=torch.device(output_cache_device),
            baseline_bytes=5 * GiB,
            readings=gpu.readings(),
        )

    engine.config = _replace_engine(engine.config, gpu_memory_utilization=0.5, kv_cache_memory=1.0)
    budget = int(0.5 * 10 * GiB) - 3 * MiB  # the share less weights and activations
    for where, gpu_block in (("cuda", kv + rows), ("cpu", kv)):
        counts[where] = gpu_pool_num_blocks(where)
        assert counts[where] == min(budget // gpu_block, 64 * 16), where
    assert counts["cpu"] == 64 * 16  # max_num_seqs sequences of max_model_len
    engine.config = _replace_engine(engine.config, max_num_seqs=100_000)
    counts = {where: gpu_pool_num_blocks(where) for where in ("cuda", "cpu")}
    assert counts == {"cuda": budget // (kv + rows), "cpu": budget // kv}
    # Explicit blocks: their bytes and a step's activations must be free.
    engine.config = _replace_engine(engine.config, num_blocks=10)
    assert gpu_pool_num_blocks("cpu") == 10
    gpu.free = 10 * kv + 2 * MiB - 1
    with pytest.raises(ConfigError, match=f"plus {2 * MiB:,} for a step's activations"):
        gpu_pool_num_blocks("cpu")
    # ... and, with the weights and that step, fit in the stage's share (0.5 of 10 GiB).
    gpu.free = 10 * GiB
    engine.config = _replace_engine(engine.config, num_blocks=budget // kv + 1)
    with pytest.raises(ConfigError, match=r"more than the stage's share, gpu_memory_utiliz"):
        gpu_pool_num_blocks("cpu")
    engine.config = _replace_engine(engine.config, num_blocks=budget // kv)
    assert gpu_pool_num_blocks("cpu") == budget // kv


def _replace_engine(config, **changes):
    return dataclasses.replace(config, engine=dataclasses.replace(config.engine, **changes))


@pytest.mark.slow
def test_cuda_graphs_are_counted_in_the_pool_sizing(qwen2_dir, monkeypatch):
    """A stage whose decode steps are padded (captured on a GPU) runs a trial capture in its
    profile: a runner of the padded steps on a one-block pool, warmed up, its graphs captured,
    then dropped. What the allocator holds meanwhile is taken from the pool's share."""
    engine = make_engine(qwen2_dir, block_size=16, max_model_len=256, max_num_seqs=8)
    model, cpu = engine.model, torch.device("cpu")
    model_kv = model.num_layers * 2 * model.num_kv_heads * model.head_dim * 4 * 16
    gpu = FakeGpu(allocated=MiB, total=10 * GiB, free=GiB, step_bytes=16 * model_kv + 2 * MiB)
    captured: list[ModelRunner] = []

    def capture_decode_graphs(runner, *, required=False):
        assert runner.decode_graphs is not None  # the padded steps, as the engine's
        captured.append(runner)
        gpu.reserved += 24 * MiB  # what the graphs would hold on a GPU

    monkeypatch.setattr(ModelRunner, "capture_decode_graphs", capture_decode_graphs)
    config = _replace_engine(engine.config, gpu_memory_utilization=0.5, max_num_seqs=100_000)
    for graphs in (None, False):  # eager on the CPU: nothing to measure
        assert trial_capture(_replace_engine(config, cuda_graphs=graphs), model, cpu, 256) is None
    trial = trial_capture(_replace_engine(config, cuda_graphs=True), model, cpu, 256)

    def blocks(capture) -> int:
        return stage_memory.gpu_pool_num_blocks(
            config, model, device=cpu, max_model_len=256, num_outputs=0, itemsize=4,
            output_cache_device=cpu, readings=gpu.readings(), capture=capture,
        )  # fmt: skip

    without, with_graphs = blocks(None), blocks(trial)
    assert len(captured) == 1 and captured[0].decode_graphs is None  # dropped after the reading
    assert without - with_graphs == -(-24 * MiB // model_kv)


@pytest.mark.slow
def test_a_trial_capture_drops_the_adapters_own_graphs():
    """The Qwen3-Omni talker's code predictor keeps graphs of its own (enable_cuda_graphs): the
    trial captures them with the decode steps' and drops them again (enable_cuda_graphs(0)),
    so only the real capture's stay."""
    from omni.config import config_for_model
    from tools.make_tiny_checkpoint import ensure_checkpoint

    model_dir = str(ensure_checkpoint("qwen3_omni_moe", "tiny"))
    overrides = {f"stages.{s}.engine.device": "cpu" for s in ("thinker", "talker", "code2wav")}
    overrides |= {"stages.talker.engine.cuda_graphs": True, "stages.talker.engine.max_num_seqs": 4}
    talker = config_for_model(model_dir, overrides=overrides).stages[1]
    engine = StageEngine(talker)
    predictor = engine.model._predictor
    assert predictor.ladder == [1, 2, 4] and predictor.graphs is not None  # the real ones
    trial = trial_capture(talker, engine.model, torch.device("cpu"), engine.max_model_len)
    assert trial is not None
    drop = trial()
    assert predictor.ladder == [1, 2, 4] and len(predictor.graphs) == 3  # the trial's
    drop()
    assert predictor.ladder == [] and predictor.graphs is None


class _Vocoder:
    """A generation adapter's memory hook, recording what the engine allowed it."""

    def __init__(self) -> None:
        self.budgets: list[int] = []

    def limit_transient_bytes(self, budget_bytes: int) -> None:
        self.budgets.append(budget_bytes)


def test_a_generation_stage_plans_its_transient_memory_within_its_share():
    stage = _stage(gpu_memory_utilization=0.09)
    gpu = FakeGpu(allocated=GiB, total=40 * GiB, free=30 * GiB)
    cuda = torch.device("cuda")
    baseline = stage_memory.reserved_gpu_bytes(cuda, gpu.readings())
    assert baseline == GiB and gpu.num_releases == 1  # read with the allocator's cache back
    gpu.reserved += 2 * GiB  # weights and chunk graphs, held from start-up on
    vocoder = _Vocoder()
    budget = stage_memory.limit_transient_memory(stage, vocoder, cuda, baseline, gpu.readings())
    left = int(0.09 * 40 * GiB) - 2 * GiB
    assert budget == int(left * stage_memory.TRANSIENT_SHARE) and vocoder.budgets == [budget]
    # Never more than is free (another stage took the rest), never below 0 (share too small).
    gpu.free = 100 * MiB
    assert stage_memory.limit_transient_memory(stage, vocoder, cuda, baseline, gpu.readings()) == (
        100 * MiB
    )
    gpu.reserved += 10 * GiB
    assert stage_memory.limit_transient_memory(stage, vocoder, cuda, baseline, gpu.readings()) == 0
    # Off a GPU, or an adapter without the hook: nothing is limited, nothing read.
    before = gpu.num_releases
    cpu = torch.device("cpu")
    assert stage_memory.limit_transient_memory(stage, vocoder, cpu, 0, gpu.readings()) is None
    assert stage_memory.limit_transient_memory(stage, object(), cuda, 0, gpu.readings()) is None
    assert gpu.num_releases == before and vocoder.budgets[-1] == 0
    assert stage_memory.reserved_gpu_bytes(cpu, gpu.readings()) == 0
