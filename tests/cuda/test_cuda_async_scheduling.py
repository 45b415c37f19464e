"""engine.async_scheduling on a GPU: decode steps launched one ahead of reading their ids, fed the
ids on the device, give transformers' float32 tokens (a roomy pool and a tiny one that preempts,
stop tokens in flight) and the same output-cache rows as synchronous steps; and a step's ids are
read without waiting for the step launched after it.

Run with `pytest -q tests/cuda -s`; skipped where torch sees no GPU (tests/conftest.py)."""

from __future__ import annotations

import pytest
import torch
from helpers import make_engine, run_engine, shared_prefix_prompts
from transformers import AutoConfig

from omni.core.sampling_params import SamplingParams
from omni.messages import StageInput
from omni.runtime.launched_step import LaunchedStep

pytestmark = [pytest.mark.cuda, pytest.mark.slow]

MAX_NEW = 16
GREEDY = SamplingParams(max_tokens=MAX_NEW, ignore_eos=True)
FP32 = {"device": "cuda", "dtype": "float32", "block_size": 4, "max_num_seqs": 6}


@pytest.fixture(scope="module")
def case(qwen2_dir):
    from test_cuda_engine import hf_greedy

    prompts = shared_prefix_prompts(AutoConfig.from_pretrained(qwen2_dir).vocab_size)
    return qwen2_dir, prompts, hf_greedy(qwen2_dir, prompts, torch.float32)


@pytest.mark.parametrize("pool", [{"num_blocks": 2048}, {"num_blocks": 48, "max_model_len": 192}])
def test_steps_ahead_equal_transformers_and_synchronous_rows(case, pool):
    model_dir, prompts, expected = case
    ahead = make_engine(model_dir, **FP32, **pool, async_scheduling=True)
    sync = make_engine(model_dir, **FP32, **pool)
    assert ahead.pipeline is not None and ahead.runner.decode_graphs is not None
    got, base = run_engine(ahead, prompts, GREEDY), run_engine(sync, prompts, GREEDY)
    for index, (ours, theirs, want) in enumerate(zip(got, base, expected, strict=True)):
        assert ours.token_ids == want, f"prompt {index}"
        torch.testing.assert_close(
            ours.tensors["hidden_states"], theirs.tensors["hidden_states"], rtol=1e-4, atol=1e-4
        )
    stats = ahead.stats()
    assert stats["steps_launched_ahead"] > 0 and stats["graph_steps"] > 0, stats
    assert ahead.kv.num_free_blocks == ahead.num_blocks


def test_a_stop_token_in_flight(case):
    model_dir, prompts, expected = case
    engine = make_engine(model_dir, **FP32, num_blocks=2048, async_scheduling=True)
    for index, (prompt, want) in enumerate(zip(prompts, expected, strict=True)):
        params = SamplingParams(max_tokens=MAX_NEW, ignore_eos=True, stop_token_ids=[want[4]])
        engine.add_request(StageInput(f"s{index}", prompt, params))
    results = {r.request_id: r for r in engine.run_until_done()}
    for index, want in enumerate(expected):
        assert results[f"s{index}"].token_ids == want[: want.index(want[4]) + 1], index
    assert engine.stats()["steps_launched_ahead"] > 0


def test_reading_ids_does_not_wait_for_later_work():
    """The ids' copy is queued behind their sampling, with its own event: work queued after it
    (a step launched ahead; here a chain of large matmuls, ~0.1 s) is still running when the
    read returns (a read that synchronised the stream would have waited for it)."""
    device = torch.device("cuda")
    ids = torch.arange(8, device=device)
    launched = LaunchedStep([f"r{i}" for i in range(8)], ids)
    x = torch.randn(4096, 4096, device=device)
    for _ in range(40):
        x = x @ x / 64
    later = torch.cuda.Event()
    later.record()
    out = launched.result()
    assert not later.query(), "reading the ids waited for the work queued after them"
    assert out.sampled_token_ids == {f"r{i}": i for i in range(8)}
    torch.cuda.synchronize()
