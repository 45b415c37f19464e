"""Host-device synchronising calls per decode step, counted on the CPU per component.

A decode step may make the host wait for the device once: the sampler's copy of the chosen ids
(`.tolist()`). Everything else a step needs from the host goes over in non_blocking uploads of
host arrays, and nothing reads the device back. tests/sync_counter.py counts the calls that
would block on a GPU (scalar reads, .tolist(), data-dependent shapes, bool-mask indexing,
tensors made from Python data, blocking cross-device copies) and charges each to the innermost
component on the stack. The eager steps' assertions are per component (the sampler, the
talker's forward and logits, the output cache's write): on the CPU the runner's packing builds
the torch attention path's plan, which reads values a GPU step never reads. The padded
(CUDA-graph) steps run with the GPU's metadata, so there every sync in the step is asserted.
"""

from __future__ import annotations

import pytest
import torch
from helpers import make_engine
from transformers import Qwen2_5OmniConfig

from omni.config import config_for_model, load_config
from omni.core.sampling_params import SamplingParams
from omni.engine import StageEngine
from omni.messages import StageInput
from omni.registry import get_prompt_processor
from omni.runtime import attention
from omni.runtime.launched_step import LaunchedStep
from omni.runtime.model_runner import ModelRunner
from omni.runtime.output_cache import OutputCache
from omni.runtime.sampler import Sampler
from stages.qwen2_5_omni.talker import OmniTalkerAdapter, speaker_key
from tests.sync_counter import SyncCounter

COMPONENTS = {
    # The step's one copy of the chosen ids (and a multi-code step's codes) is the runner's.
    # The sampler, and the read of its ids (the step's one sync).
    "sampler": [Sampler.__call__, Sampler.sample, ModelRunner._sample, LaunchedStep.result],
    "talker": [OmniTalkerAdapter.forward, OmniTalkerAdapter.compute_logits],
    "output cache": [OutputCache.write, OutputCache.discover],
}
NUM_COUNTED = 4


def count_decode_steps(
    engine: StageEngine, num_requests: int, components: dict | None = None
) -> SyncCounter:
    """Step until every request decodes, then count NUM_COUNTED pure decode steps, charged to
    `components` (default: COMPONENTS)."""
    for _ in range(3):
        engine.step()
    with SyncCounter(components or COMPONENTS) as counter:
        for _ in range(NUM_COUNTED):
            scheduled = engine.scheduler.schedule()
            entries = scheduled.scheduled
            assert len(entries) == num_requests
            assert all(len(e.token_ids) == 1 and e.sample and not e.is_new for e in entries)
            engine.update(scheduled, engine.runner.execute(scheduled))
    return counter


def causal_lm_counts(model_dir: str, **engine: object) -> SyncCounter:
    """Greedy, top-p (with logprobs: read in the same copy), seeded top-k and JSON-constrained
    requests decoding together (the output cache kept)."""
    engine_ = make_engine(model_dir, block_size=4, num_blocks=64, **engine)
    params = [
        SamplingParams(max_tokens=20, ignore_eos=True),
        SamplingParams(max_tokens=20, ignore_eos=True, temperature=0.8, top_p=0.9, logprobs=3),
        SamplingParams(max_tokens=20, ignore_eos=True, temperature=1.0, top_k=5, seed=3),
        # its token mask goes over in an upload of its own (a non_blocking copy, no sync)
        SamplingParams(max_tokens=20, ignore_eos=True, json_schema={"type": "object"}),
    ]
    for i, p in enumerate(params):
        engine_.add_request(StageInput(f"r{i}", [5 + i, 6, 7, 8, 9][: 3 + i], p))
    return count_decode_steps(engine_, len(params))


def talker_counts(omni_dir: str, **engine: object) -> SyncCounter:
    """Masked and unmasked talker requests, one with a penalty of its own."""
    stage = {
        "name": "talker",
        "model": omni_dir,
        "adapter": "qwen2_5_omni_talker",
        "engine": {"block_size": 4, "num_blocks": 64, "device": "cpu", **engine},
    }
    engine_ = StageEngine(load_config({"stages": [stage]}).stages[0])
    dim = Qwen2_5OmniConfig.from_pretrained(omni_dir).talker_config.embedding_size
    gen = torch.Generator().manual_seed(0)
    cases = [("masked", 1.05), ("unmasked", 1.05), ("masked", 1.3)]
    for i, (mode, penalty) in enumerate(cases):
        prompt, output = [5, 17, 99, 3 + i], [7, 8, 9, 10]
        rows = len(prompt) + len(output) - 1
        extras = {
            "thinker_prompt_ids": prompt,
            "thinker_output_ids": output,
            "thinker_hidden": torch.randn(rows, dim, generator=gen),
            "thinker_embeds": torch.randn(rows, dim, generator=gen),
            "mode": mode,
            "repetition_penalty": penalty,
        }
        ids = prompt + [speaker_key("Chelsie"), output[0]]
        params = SamplingParams(max_tokens=20, ignore_eos=True)
        engine_.add_request(StageInput(f"t{i}", ids, params, extras=extras))
    return count_decode_steps(engine_, len(cases))


def thinker_counts(model_dir: str, **engine: object) -> SyncCounter:
    """Three chat requests through an omni family's thinker (its shipped config, on the CPU),
    its output cache kept for the talker."""
    overrides = {"stages.thinker.engine.device": "cpu"}
    overrides.update({f"stages.thinker.engine.{k}": v for k, v in engine.items()})
    root = config_for_model(model_dir, overrides=overrides).stages[0]
    processor = get_prompt_processor(root.adapter)(root.model)
    engine_ = StageEngine(root)
    params = SamplingParams(max_tokens=20, ignore_eos=True)
    for i in range(3):
        prompt = processor(f"r{i}", {"prompt": f"say {i} things"})
        ids, extras = list(prompt.prompt_token_ids), dict(prompt.extras)
        engine_.add_request(StageInput(f"r{i}", ids, params, extras=extras))
    return count_decode_steps(engine_, 3)


@pytest.fixture
def gpu_metadata(monkeypatch):
    """Attention metadata as a GPU step makes it: index tensors handed to the Triton kernel (run
    by its interpreter here) with no torch-path plan, so the step's values are never read back:
    the CPU plan's reads are not what a GPU step makes. Every sync left is then a GPU step's.
    Skipped where a GPU is: its triton may be another torch's, whose interpreter fails our kernel
    (docs/gpu.md, "torch versions"); tests/cuda/test_cuda_step_syncs.py counts there."""
    if torch.cuda.is_available():
        pytest.skip("interpreted Triton on a GPU machine; tests/cuda/test_cuda_step_syncs.py runs")
    monkeypatch.setattr(attention, "uses_triton", lambda device: True)


def test_causal_lm_decode_step_syncs(qwen2_dir, one_torch_thread):
    counter = causal_lm_counts(qwen2_dir)
    assert counter.of("sampler") == ["tolist"] * NUM_COUNTED
    assert counter.of("output cache") == []


@pytest.mark.slow
def test_talker_decode_step_syncs(omni_dir):
    """The talker's forward and logits (inputs, codec history, penalty) make no sync."""
    counter = talker_counts(omni_dir)
    assert counter.of("talker") == []
    assert counter.of("sampler") == ["tolist"] * NUM_COUNTED
    assert counter.of("output cache") == []


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["causal_lm", "talker", "thinker", "qwen3_thinker"])
def test_padded_decode_steps_sync_only_for_their_ids(stage, gpu_metadata, one_torch_thread):
    """The padded (CUDA-graph) decode step of every stage kind, with the GPU's attention
    metadata: the step's one sync is the read of its ids, and there is none anywhere else in
    it (the runner, the padded buffers' fill, the adapters' decode_prepare and body, the output
    cache, the logits: "other" included)."""
    from tools.make_tiny_checkpoint import ensure_checkpoint

    family = {"causal_lm": "qwen2", "qwen3_thinker": "qwen3_omni_moe"}.get(stage, "qwen2_5_omni")
    model_dir = str(ensure_checkpoint(family, "tiny"))
    counts = {"causal_lm": causal_lm_counts, "talker": talker_counts}.get(stage, thinker_counts)
    counter = counts(model_dir, cuda_graphs=True)
    assert counter.counts == {"sampler": ["tolist"] * NUM_COUNTED}
