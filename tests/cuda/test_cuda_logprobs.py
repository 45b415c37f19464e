"""Logprobs on a GPU (tests/integration/test_logprobs.py's oracles: one teacher-forced
transformers forward, float32, on the CPU): float32 stages, decode steps replayed as CUDA graphs
and launched ahead, every kind of row in one batch, and prompt logprobs beside them; the ids and
the logprobs come back in the step's one copy."""

from __future__ import annotations

import pytest
from helpers import make_engine, shared_prefix_prompts
from transformers import AutoConfig

from omni.core.sampling_params import SamplingParams
from omni.messages import StageInput
from tests.integration.test_logprobs import KINDS, check
from tests.integration.test_logprobs import oracle as oracle  # noqa: F401  # fixtures
from tests.integration.test_logprobs import prompt_oracle as prompt_oracle  # noqa: F401

pytestmark = [pytest.mark.cuda, pytest.mark.slow]
GPU_TOLERANCE = 1e-3  # float32 on the GPU against the CPU's forward


@pytest.mark.parametrize("ahead", [False, True])
def test_logprobs_on_cuda_equal_transformers(qwen2_dir, oracle, prompt_oracle, ahead):  # noqa: F811
    prompts = shared_prefix_prompts(AutoConfig.from_pretrained(qwen2_dir).vocab_size, 3)
    engine = make_engine(qwen2_dir, device="cuda", dtype="float32", block_size=4,
                         num_blocks=512, max_num_seqs=16, async_scheduling=ahead)  # fmt: skip
    for i, prompt in enumerate(prompts):
        for kind, params in KINDS.items():
            engine.add_request(StageInput(f"{kind}-{i}", prompt, params))
    scored = SamplingParams(max_tokens=2, ignore_eos=True, prompt_logprobs=2)
    for i, prompt in enumerate(prompts):
        engine.add_request(StageInput(f"prompt-{i}", prompt, scored))
    results = {r.request_id: r for r in engine.run_until_done()}
    for request_id, result in results.items():
        kind, i = request_id.split("-")
        if kind == "prompt":  # each prompt token's logprob, from the row before it
            expected = prompt_oracle(prompts[int(i)])
            assert result.prompt_logprobs is not None and result.prompt_logprobs[0] is None
            for position, entry in enumerate(result.prompt_logprobs[1:], 1):
                token = prompts[int(i)][position]
                assert abs(entry.logprob - expected[position - 1, token].item()) < GPU_TOLERANCE
            continue
        check(result, prompts[int(i)], KINDS[kind], oracle, GPU_TOLERANCE)
    stats = engine.stats()
    assert stats["graph_steps"] > 0 and (stats["steps_launched_ahead"] > 0) == ahead
