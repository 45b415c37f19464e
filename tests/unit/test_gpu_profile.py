"""A GPU stage's footprint (omni/engine/gpu_profile.py) on injected allocator readings: its own
weights measured against the baseline taken before it loaded (not the process's whole peak, which
holds the earlier stages of a local pipeline), the profiled step's activations without its
temporary KV, the adapter's extra work inside the measured window and its reserve counted; and
the step profiled is the costliest the sampler runs (top-k and top-p over max_num_seqs rows)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from helpers import FakeGpu

from omni.config import ConfigError, load_config
from omni.core.logprobs import MAX_LOGPROBS
from omni.core.sampling_params import SamplingParams
from omni.engine.cache_sizing import gpu_num_blocks
from omni.engine.gpu_profile import measure_footprint, profile_stage, split_profile
from omni.runtime.model_runner import ModelRunner
from omni.runtime.sampler import TOP_K_CAP, Sampler
from omni.runtime.stage_model import ModelInputs, ModelOutputs, StageModelBase

GiB, MiB = 1 << 30, 1 << 20


def test_split_profile_takes_the_stage_share_only():
    # A local pipeline's talker: the thinker's weights and pool (36 GiB) were there before it.
    weights, activations = split_profile(
        baseline=36 * GiB, loaded=48 * GiB, max_allocated=51 * GiB, kv_bytes=GiB
    )
    assert (weights, activations) == (12 * GiB, 2 * GiB)
    assert split_profile(baseline=0, loaded=5, max_allocated=9, kv_bytes=4) == (5, 0)
    with pytest.raises(ValueError, match="baseline 6 bytes is not within"):
        split_profile(baseline=6, loaded=5, max_allocated=9, kv_bytes=0)
    with pytest.raises(ValueError, match="max_allocated 8 bytes is below loaded 5"):
        split_profile(baseline=0, loaded=5, max_allocated=8, kv_bytes=4)


def test_the_talker_after_the_thinker_gets_its_share():
    """Review finding 2: on one 80 GiB GPU the thinker holds 36 GiB when the talker (share
    0.15 = 12 GiB, 2 GiB of weights) is profiled. Measured against the process's allocations,
    its 'peak' exceeds its whole share; against its baseline it leaves ~9 GiB for KV."""
    gpu = FakeGpu(allocated=36 * GiB + 2 * GiB, total=80 * GiB, free=40 * GiB)
    gpu.step_bytes = MiB + 512 * MiB  # the profile's temporary KV + activations

    footprint = measure_footprint(gpu.readings(), baseline=36 * GiB, run=lambda: MiB)
    assert footprint.weights_bytes == 2 * GiB and footprint.activation_bytes == 512 * MiB
    assert footprint.peak_bytes == 2 * GiB + 512 * MiB
    assert (footprint.free_bytes, footprint.total_bytes) == (40 * GiB, 80 * GiB)
    assert gpu.num_releases == 2  # the allocator's cache handed back before each reading

    stage = load_config(
        {"stages": [{"name": "talker", "model": "m", "engine": {"max_num_seqs": 4096}}]},
        check_models=False,
    ).stages[0]
    common = dict(total_bytes=80 * GiB, utilization=0.15, block_bytes=MiB, max_model_len=2048)
    blocks = gpu_num_blocks(stage, peak_bytes=footprint.peak_bytes, **common)
    assert blocks == (int(0.15 * 80 * GiB) - 2 * GiB - 512 * MiB) // MiB
    process_wide = gpu.step_bytes + gpu.allocated - MiB  # what the old measure took as its peak
    with pytest.raises(ConfigError, match="one sequence of max_model_len=2048 needs"):
        gpu_num_blocks(stage, peak_bytes=process_wide, **common)


class _TinyModel(StageModelBase):
    """A stage model whose forward and extra work 'allocate' on a FakeGpu (a test double)."""

    num_layers, num_kv_heads, head_dim, hidden_size, vocab_size = 1, 2, 4, 8, 64
    eos_token_id = None
    dtype = torch.float32
    reserved_bytes = 3 * MiB

    def __init__(self, gpu: FakeGpu, forward_bytes: int, extra_bytes: int) -> None:
        self.gpu, self.forward_bytes, self.extra_bytes = gpu, forward_bytes, extra_bytes
        self.logit_rows: list[int] = []
        self.extra_runs = 0
        self.weight = torch.randn(self.hidden_size, self.vocab_size)

    def forward(self, inputs: ModelInputs) -> ModelOutputs:
        self.gpu.hold(self.forward_bytes)
        return ModelOutputs(torch.randn(inputs.input_ids.numel(), self.hidden_size))

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        self.logit_rows.append(hidden_states.shape[0])
        return hidden_states @ self.weight

    def profile_extra_work(self) -> None:
        self.extra_runs += 1
        self.gpu.hold(self.extra_bytes)


@pytest.mark.parametrize("extra_mib", [1, 40])
def test_profile_stage_counts_extra_work_and_reserve(extra_mib):
    pool = 7 * 16 * 2 * 2 * 4 * 4  # the profile's KV: ceil(100 / 16) blocks, K and V, float32
    gpu = FakeGpu(allocated=10 * GiB, total=80 * GiB, free=60 * GiB, step_bytes=pool)
    model = _TinyModel(gpu, forward_bytes=20 * MiB, extra_bytes=extra_mib * MiB)
    footprint = profile_stage(
        model,
        block_size=16,
        num_tokens=100,
        num_sample_rows=32,
        device=torch.device("cpu"),
        baseline=9 * GiB,
        readings=gpu.readings(),
    )
    # The sampled rows' logits, then a prompt-logprobs chunk's (all 100 rows: under 256).
    assert model.extra_runs == 1 and model.logit_rows == [32, 100]
    assert footprint.weights_bytes == GiB and footprint.reserved_bytes == 3 * MiB
    # The larger of the forward and the extra work (they run one after the other).
    assert footprint.activation_bytes == max(20, extra_mib) * MiB
    assert footprint.peak_bytes == GiB + 3 * MiB + max(20, extra_mib) * MiB


class _RecordingSampler(Sampler):
    """The runner's sampler, recording the parameters of every row it samples (a test double)."""

    def __init__(self) -> None:
        super().__init__(0)
        self.params: list[SamplingParams] = []

    def sample(self, logits, params, num_output_tokens, **kwargs):
        self.params.extend(params)
        return super().sample(logits, params, num_output_tokens, **kwargs)


def test_profile_forward_samples_the_costliest_rows():
    gpu = FakeGpu(allocated=0, total=1, free=1)
    model = _TinyModel(gpu, forward_bytes=0, extra_bytes=0)
    runner = ModelRunner(model, num_blocks=8, block_size=16, output_cache=None)
    runner.sampler = _RecordingSampler()
    runner.profile_forward(100, 32)
    assert model.logit_rows == [32, 100] and len(runner.sampler.params) == 32
    # The costliest path: not greedy, both filters, a top_k that sorts the whole vocabulary
    # (not topk's few columns), the most logprobs.
    for params in runner.sampler.params:
        assert not params.greedy and params.top_k > TOP_K_CAP and params.top_p < 1
        assert params.logprobs == MAX_LOGPROBS and params.penalized and params.logit_bias
    # The step allocated the penalties' counts of 32 requests (in the profiled peak); no slot
    # is held after it.
    penalties = runner.sampler.penalties
    assert penalties.counts is not None and penalties.counts.shape[0] >= 32
    assert penalties._slots == {}


def test_a_trial_capture_of_cuda_graphs_counts_in_the_peak():
    """Graphs are captured after the KV pool (they bake its addresses in), so the profile
    captures them once on a temporary pool: what the allocator reserves while they are held is
    the stage's, from start-up on. The graphs are dropped before the free bytes are read."""
    gpu = FakeGpu(allocated=GiB, total=80 * GiB, free=60 * GiB, step_bytes=MiB + 20 * MiB)
    events: list[str] = []

    def capture():
        events.append("captured")
        gpu.reserved += 48 * MiB  # the graphs' pool, static buffers, scratch blocks

        def drop() -> None:
            events.append("dropped")
            gpu.reserved -= 48 * MiB

        return drop

    readings = gpu.readings()
    mem_info = readings.mem_info
    readings = dataclasses.replace(
        readings, mem_info=lambda: (events.append("free read"), mem_info())[1]
    )
    footprint = measure_footprint(readings, baseline=0, run=lambda: MiB, capture=capture)
    assert events == ["captured", "dropped", "free read"]
    assert footprint.graph_bytes == 48 * MiB and footprint.activation_bytes == 20 * MiB
    assert footprint.peak_bytes == GiB + 48 * MiB + 20 * MiB
    # Without graphs nothing changes; a capture that frees more than it holds counts nothing.
    assert measure_footprint(gpu.readings(), baseline=0, run=lambda: MiB).graph_bytes == 0

    def freeing():
        gpu.reserved -= MiB
        return lambda: None

    assert (
        measure_footprint(gpu.readings(), baseline=0, run=lambda: MiB, capture=freeing).graph_bytes
        == 0
    )
