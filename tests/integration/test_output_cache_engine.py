"""Stage outputs with the output cache on equal those computed without any caching, and equal
transformers' own last hidden states, under eviction, preemption, chunked prefill and aborts."""

import pytest
import torch
from helpers import make_engine, run_engine, shared_prefix_prompts
from transformers import AutoConfig, AutoModelForCausalLM

from omni.core.sampling_params import SamplingParams
from omni.messages import StageInput
from omni.runtime.stage_model import ModelOutputs, StageModelBase

pytestmark = pytest.mark.slow
PARAMS = SamplingParams(max_tokens=6, ignore_eos=True)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm().clamp_min(1e-12)).item()


@pytest.fixture(scope="module")
def prompts(qwen2_dir):
    return shared_prefix_prompts(
        AutoConfig.from_pretrained(qwen2_dir).vocab_size, num_prompts=9, seed=3
    )


@pytest.fixture(scope="module")
def uncached(qwen2_dir, prompts):
    engine = make_engine(qwen2_dir, block_size=4, enable_prefix_caching=False)
    return run_engine(engine, prompts, PARAMS)


TRACES = {
    "plain": {"block_size": 4},
    "tiny-pool": {"block_size": 4, "num_blocks": 40, "max_model_len": 128},
    "chunked": {"block_size": 4, "max_num_batched_tokens": 20},
    "tiny-pool-chunked": {
        "block_size": 2,
        "num_blocks": 70,
        "max_num_batched_tokens": 12,
        "max_model_len": 128,
    },
}


@pytest.mark.parametrize("trace", list(TRACES))
def test_cached_outputs_equal_uncached(qwen2_dir, prompts, uncached, trace):
    engine = make_engine(qwen2_dir, **TRACES[trace])
    first = run_engine(engine, prompts, PARAMS, prefix="a")
    second = run_engine(engine, prompts, PARAMS, prefix="b")  # repeated: served from the caches
    for results in (first, second):
        for got, want in zip(results, uncached, strict=True):
            assert got.token_ids == want.token_ids
            assert got.tensors["hidden_states"].shape == want.tensors["hidden_states"].shape
            assert rel_err(got.tensors["hidden_states"], want.tensors["hidden_states"]) < 1e-5
    stats = engine.stats()
    assert stats["output_hit_rows"] > 0
    assert sum(r.num_cached_tokens for r in second) > 0
    if trace.startswith("tiny-pool"):
        assert stats["preemptions"] > 0 and stats["kv_evictions"] > 0


def test_hidden_states_equal_transformers(qwen2_dir, prompts):
    model = AutoModelForCausalLM.from_pretrained(
        qwen2_dir, dtype=torch.float32, attn_implementation="sdpa"
    ).eval()
    for caching in (True, False):
        engine = make_engine(qwen2_dir, block_size=4, enable_prefix_caching=caching)
        results = run_engine(engine, prompts + prompts, PARAMS)
        for result in results:
            fed = result.prompt_token_ids + result.token_ids[:-1]
            with torch.inference_mode():
                ref = model(torch.tensor([fed]), output_hidden_states=True).hidden_states[-1][0]
            assert result.tensors["hidden_states"].shape == (len(fed), model.config.hidden_size)
            assert rel_err(result.tensors["hidden_states"], ref) < 1e-4
        if caching:
            assert engine.stats()["output_hit_rows"] > 0


def test_aborted_requests_leave_valid_rows(qwen2_dir, prompts, uncached):
    engine = make_engine(qwen2_dir, block_size=4, max_num_batched_tokens=16)
    for i, prompt in enumerate(prompts):
        engine.add_request(StageInput(f"x{i}", prompt, PARAMS))
    for _ in range(3):
        engine.step()  # mid chunked prefill for several requests
    aborted = engine.abort([f"x{i}" for i in range(len(prompts))])
    assert {r.finish_reason for r in aborted} == {"aborted"}
    results = run_engine(engine, prompts, PARAMS, prefix="y")
    for got, want in zip(results, uncached, strict=True):
        assert rel_err(got.tensors["hidden_states"], want.tensors["hidden_states"]) < 1e-5
    assert sum(r.num_cached_tokens for r in results) > 0


def test_same_step_hits_wait_for_the_write(qwen2_dir, prompts, uncached):
    """Two identical prompts in one step: the second hits blocks the first caches in that same
    step (pending rows); its outputs are still exact because the rows are written by the same
    forward, before any request can finish."""
    engine = make_engine(qwen2_dir, block_size=4)
    long_prompt = max(prompts, key=len)
    results = run_engine(engine, [long_prompt, long_prompt], PARAMS)
    assert results[1].num_cached_tokens > 0
    assert engine.output_cache.pending_hit_blocks > 0
    torch.testing.assert_close(
        results[0].tensors["hidden_states"], results[1].tensors["hidden_states"]
    )


class ExtraOutputs(StageModelBase):
    """Wraps an adapter: adds a per-token output from step `late_from` on, and a pooled one."""

    def __init__(self, inner, late_from: int) -> None:
        self.inner, self.late_from, self.steps = inner, late_from, 0
        for name in (
            "num_layers",
            "num_kv_heads",
            "head_dim",
            "hidden_size",
            "vocab_size",
            "eos_token_id",
            "dtype",
        ):
            setattr(self, name, getattr(inner, name))

    def forward(self, inputs):
        out = self.inner.forward(inputs)
        self.steps += 1
        extra = {"pooled": out.hidden_states.mean(0, keepdim=True)[:, :3]}
        if self.steps >= self.late_from:
            extra["late"] = out.hidden_states[:, :5] * 2
        return ModelOutputs(out.hidden_states, extra)

    def compute_logits(self, hidden_states):
        return self.inner.compute_logits(hidden_states)


def test_rows_missing_for_a_late_output_are_recomputed(qwen2_dir, prompts):
    """A per-token output first seen after some blocks were cached has no rows for them: it is
    left out (counted) for requests already running, and hits on those blocks are refused and
    recomputed (counted), never served half-filled."""
    from omni.engine import StageEngine

    base = make_engine(qwen2_dir, block_size=4)
    # Forwards of the wrapped model: 1-2 warm-up (2 tokens, then 1), 3 prefill of `first`, 4+
    # decode (1 token each).
    model = ExtraOutputs(base.model, late_from=4)
    engine = StageEngine(base.config, model=model)
    assert set(engine.output_cache.caches) == {"hidden_states"}  # warm-up: "pooled" passes through
    prompt, other = sorted(prompts, key=len)[-2:]
    first = run_engine(engine, [prompt], PARAMS, prefix="a")[0]
    assert "late" not in engine.output_cache.caches  # one-token steps do not discover
    second = run_engine(engine, [prompt, other], PARAMS, prefix="b")  # discovers "late"
    assert "late" in engine.output_cache.caches and "pooled" not in engine.output_cache.caches
    assert "late" not in second[0].tensors and engine.stats()["outputs_left_out"] == 2
    assert second[0].num_cached_tokens > 0
    third = run_engine(engine, [prompt], PARAMS, prefix="c")[0]
    # The blocks cached by `first` have no "late" rows: refused, recomputed, counted.
    assert third.num_cached_tokens == 0
    assert engine.stats()["rows_recomputed"] == (len(prompt) - 1) // 4 * 4
    torch.testing.assert_close(third.tensors["late"], third.tensors["hidden_states"][:, :5] * 2)
    fourth = run_engine(engine, [prompt], PARAMS, prefix="d")[0]  # fresh duplicates now serve
    assert fourth.num_cached_tokens == (len(prompt) - 1) // 4 * 4
    torch.testing.assert_close(fourth.tensors["late"], fourth.tensors["hidden_states"][:, :5] * 2)
    for result in (second[0], third, fourth):
        torch.testing.assert_close(first.tensors["hidden_states"], result.tensors["hidden_states"])
