"""Host-device synchronising calls per decode step of the Qwen3-Omni talker, counted on the CPU
per component (tests/sync_counter.py; the rules of tests/integration/test_step_syncs.py): its
inputs, codec history, repetition penalty and code predictor make none, eager or through the
padded (CUDA-graph) body; the step's one sync is the runner's copy of its ids and codes."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from omni.config import config_for_model
from omni.core.sampling_params import SamplingParams
from omni.engine.stage_engine import StageEngine
from omni.messages import StageInput
from omni.registry import get_input_processor, get_prompt_processor
from omni.runtime import attention
from omni.runtime.launched_step import LaunchedStep
from omni.runtime.model_runner import ModelRunner
from omni.runtime.sampler import Sampler
from stages.qwen3_omni_moe.code_predictor import CodePredictor
from stages.qwen3_omni_moe.talker import Qwen3OmniTalkerAdapter
from tests.integration.test_step_syncs import count_decode_steps
from tests.sync_counter import SyncCounter

pytestmark = pytest.mark.slow

TALKER = Qwen3OmniTalkerAdapter
COMPONENTS = {
    "sampler": [Sampler.__call__, Sampler.sample, ModelRunner._sample, LaunchedStep.result],
    "talker": [
        TALKER.forward,
        TALKER.decode_prepare,
        TALKER.decode_forward,
        TALKER.compute_logits,
        TALKER.sample_codes,
        CodePredictor.__call__,
    ],  # fmt: skip
}


@pytest.fixture(scope="module")
def qwen3_dir(one_torch_thread):
    from tools.make_tiny_checkpoint import ensure_checkpoint

    return str(ensure_checkpoint("qwen3_omni_moe", "tiny"))


def talker_counts(qwen3_dir: str, **engine: object) -> tuple[SyncCounter, StageEngine]:
    """Three requests from the thinker (two speakers, one with a repetition penalty of 1.3)."""
    overrides = {f"stages.{s}.engine.device": "cpu" for s in ("thinker", "talker", "code2wav")}
    overrides.update({f"stages.talker.engine.{k}": v for k, v in engine.items()})
    config = config_for_model(qwen3_dir, overrides=overrides)
    root, talker = config.stages[0], config.stages[1]
    processor = get_prompt_processor(root.adapter)(root.model)
    thinker = StageEngine(root)
    prompts = {}
    for i, speaker in enumerate(["Ethan", "Chelsie", "Ethan"]):
        prompt = processor(f"r{i}", {"prompt": f"say {i} things", "speaker": speaker})
        prompts[f"r{i}"] = prompt
        params = SamplingParams(max_tokens=4, ignore_eos=True)
        thinker.add_request(StageInput(f"r{i}", list(prompt.prompt_token_ids), params,
                                       extras=dict(prompt.extras)))  # fmt: skip
    results = {r.request_id: r for r in thinker.run_until_done()}
    engine_ = StageEngine(talker)
    edge = get_input_processor(talker.input_processor)
    params = SamplingParams(max_tokens=30, ignore_eos=True)
    for i, (request_id, prompt) in enumerate(prompts.items()):
        stage_input = edge({"thinker": results[request_id]}, prompt)
        extras = {**stage_input.extras, "repetition_penalty": 1.3 if i == 2 else 1.05}
        engine_.add_request(dataclasses.replace(stage_input, sampling_params=params, extras=extras))
    return count_decode_steps(engine_, len(prompts), COMPONENTS), engine_


@pytest.mark.parametrize("padded", [False, True], ids=["eager", "padded-decode"])
def test_talker_decode_step_syncs(qwen3_dir, padded, monkeypatch):
    if padded:  # the GPU's attention metadata (test_step_syncs.gpu_metadata): no CPU plan
        if torch.cuda.is_available():
            pytest.skip("interpreted Triton on a GPU machine (test_step_syncs.gpu_metadata)")
        monkeypatch.setattr(attention, "uses_triton", lambda device: True)
    counter, engine = talker_counts(qwen3_dir, cuda_graphs=padded, max_num_seqs=4)
    assert counter.of("talker") == []
    assert counter.of("sampler") == ["tolist"] * 4
    if padded:  # nothing else anywhere in the step, the padded buffers' fill included
        assert counter.counts == {"sampler": ["tolist"] * 4}
    # padded: the counted steps ran the decode body (3 rows padded to 4) and the predictor's
    # padded graph buffers
    assert (engine.stats().get("padded_rows", 0) >= 4) == padded
    assert (engine.model._predictor.num_replayed >= 4) == padded
