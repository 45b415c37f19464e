"""code2wav batched across requests (engine.batch_whole_requests): one GenerationEngine step
decodes every ready whole request as one [B, groups, T] batch, each row cut at its own length.

On the CPU a batched row equals its decode alone only up to float rounding, and not because of
the padding (stages/qwen3_omni_moe/code2wav.py says why: PyTorch picks its convolution kernel by
the batch's shape); so the CPU default decodes one request per step, bit-equal to transformers.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from omni.config import load_config
from omni.core.sampling_params import SamplingParams
from omni.engine.generation_engine import GenerationEngine
from omni.messages import StageInput

pytestmark = pytest.mark.slow

LENGTHS = (2, 9, 40, 310)  # 310 frames: two chunked_decode windows for that row alone


@pytest.fixture(scope="module")
def qwen3_dir(one_torch_thread):
    from tools.make_tiny_checkpoint import ensure_checkpoint

    return str(ensure_checkpoint("qwen3_omni_moe", "tiny"))


@pytest.fixture(scope="module")
def adapter(qwen3_dir):
    from stages.qwen3_omni_moe.code2wav import Qwen3OmniCode2WavAdapter

    return Qwen3OmniCode2WavAdapter(qwen3_dir)


def _engine(qwen3_dir, adapter=None, **engine) -> GenerationEngine:
    stage = {"name": "code2wav", "model": qwen3_dir, "kind": "generation",
             "adapter": "qwen3_omni_moe_code2wav", "engine": {"device": "cpu", **engine}}  # fmt: skip
    return GenerationEngine(load_config({"stages": [stage]}).stages[0], model=adapter)


def _inputs(adapter) -> list[StageInput]:
    rng = np.random.default_rng(5)
    inputs = []
    for i, frames in enumerate(LENGTHS):
        codes = rng.integers(0, adapter.codebook_size, (frames, adapter.num_code_groups))
        inputs.append(StageInput(f"r{i}", codes[:, 0].tolist(), SamplingParams(max_tokens=1),
                                 extras={"codes": codes}))  # fmt: skip
    return inputs


def _run(engine: GenerationEngine, inputs: list[StageInput]) -> dict[str, torch.Tensor]:
    for stage_input in inputs:
        engine.add_request(stage_input)
    return {r.request_id: r.audio for r in engine.run_until_done()}


def test_one_step_decodes_all_requests_as_one_batch(qwen3_dir, adapter):
    inputs = _inputs(adapter)
    alone = {s.request_id: adapter.generate(s, 0) for s in inputs}
    batched = _engine(qwen3_dir, adapter, batch_whole_requests=True, max_num_seqs=8,
                      max_num_batched_tokens=4096)  # fmt: skip  # the CPU's default is 256
    audio = _run(batched, inputs)
    assert batched.num_steps == 1 and batched.stats()["finished"] == len(LENGTHS)
    for request_id, wav in alone.items():
        assert wav.numel() > 0 and audio[request_id].shape == wav.shape, request_id
        torch.testing.assert_close(audio[request_id], wav, atol=1e-5, rtol=0)
    # The CPU default: one request per step, each exactly its decode alone.
    single = _engine(qwen3_dir, adapter)
    audio = _run(single, inputs)
    assert single.num_steps == len(LENGTHS)
    assert all(torch.equal(audio[i], wav) for i, wav in alone.items())


def test_batch_budget_counts_padding(qwen3_dir, adapter):
    """max_num_batched_tokens bounds a step's batch as rows x its longest row."""
    engine = _engine(qwen3_dir, adapter, batch_whole_requests=True, max_num_batched_tokens=80)
    inputs = _inputs(adapter)[:3]  # 2, 9, 40 frames: 3 x 40 > 80, so two steps (2 x 9, then 40)
    _run(engine, inputs)
    assert engine.num_steps == 2


def test_batching_needs_an_adapter_that_batches():
    """token2wav (Qwen2.5-Omni) has no generate_batch: a clear error before any weight loads."""
    from tools.make_tiny_checkpoint import ensure_checkpoint

    omni_dir = str(ensure_checkpoint("qwen2_5_omni", "tiny"))
    stage = {"name": "voice", "model": omni_dir, "kind": "generation",
             "adapter": "qwen2_5_omni_token2wav", "engine": {"batch_whole_requests": True}}  # fmt: skip
    with pytest.raises(ValueError, match="engine.batch_whole_requests is true but adapter"):
        GenerationEngine(load_config({"stages": [stage]}).stages[0])
