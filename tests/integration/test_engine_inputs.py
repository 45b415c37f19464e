"""Engine-level input validation and seeded sampling."""

import time

import pytest
from helpers import make_engine, run_engine

from omni.core.sampling_params import SamplingParams
from omni.messages import StageInput

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def engine(qwen2_dir):
    return make_engine(qwen2_dir, block_size=4, num_blocks=64, max_model_len=200)


@pytest.mark.parametrize(
    ("prompt", "params", "match"),
    [
        (list(range(3, 204)), None, r"prompt of 201 tokens is longer than max_model_len=200"),
        ([], None, "prompt_token_ids is empty"),
        ([5, 999_999], None, r"token id 999999 is outside the vocabulary of \d+"),
        ([5, -1], None, r"prompt_token_ids\[1\] = -1 is negative"),
        ([5, 6], {"max_tokens": 0}, "SamplingParams.max_tokens"),
        ([5, 6], {"temperature": -1.0}, "SamplingParams.temperature"),
        ([5, 6], {"top_p": 0.0}, "SamplingParams.top_p"),
        ([5, 6], {"top_p": 1.01}, "SamplingParams.top_p"),
    ],
)
def test_bad_input_is_rejected_and_others_continue(engine, prompt, params, match):
    good = StageInput("good", [5, 6, 7, 8, 9], SamplingParams(max_tokens=3))
    engine.add_request(good)
    with pytest.raises(ValueError, match=match):
        engine.add_request(
            StageInput("bad", prompt, SamplingParams(**params) if params else SamplingParams())
        )
    results = engine.run_until_done()
    assert [r.request_id for r in results] == ["good"] and len(results[0].token_ids) == 3
    assert not engine.has_unfinished


def test_pool_too_small_for_the_request(qwen2_dir):
    engine = make_engine(qwen2_dir, block_size=4, num_blocks=8, max_model_len=200)
    with pytest.raises(ValueError, match=r"need 11 blocks, but stage 'llm' has num_blocks=8"):
        engine.add_request(StageInput("big", list(range(3, 40)), SamplingParams(max_tokens=4)))


def test_max_tokens_beyond_the_context_is_capped(engine):
    """The Python API caps at max_model_len with finish_reason "length" (the server refuses)."""
    prompt = list(range(3, 193))  # 190 tokens of max_model_len=200: room for 10
    engine.add_request(StageInput("long", prompt, SamplingParams(max_tokens=1000, ignore_eos=True)))
    (result,) = engine.run_until_done()
    assert len(result.token_ids) == 10 and result.finish_reason == "length"
    assert not engine.has_unfinished


def test_duplicate_request_id(engine):
    engine.add_request(StageInput("dup", [5, 6], SamplingParams(max_tokens=1)))
    with pytest.raises(ValueError, match="'dup' is already"):
        engine.add_request(StageInput("dup", [5, 6], SamplingParams(max_tokens=1)))
    engine.run_until_done()


def test_seeded_sampling_alone_equals_in_a_batch(qwen2_dir):
    seeded = SamplingParams(max_tokens=12, temperature=1.0, top_p=0.9, seed=42, ignore_eos=True)
    prompt = [7, 8, 9, 10, 11, 12]
    alone = run_engine(make_engine(qwen2_dir, block_size=4), [prompt], seeded)[0]
    others = [[20, 21, 22], [30, 31, 32, 33, 34, 35, 36], [7, 8, 9, 10]]
    engine = make_engine(qwen2_dir, block_size=4)
    for i, other in enumerate(others):
        engine.add_request(
            StageInput(
                f"o{i}", other, SamplingParams(max_tokens=12, temperature=0.8, ignore_eos=True)
            )
        )
    engine.add_request(StageInput("seeded", prompt, seeded))
    batched = {r.request_id: r for r in engine.run_until_done()}["seeded"]
    assert batched.token_ids == alone.token_ids
    other_seed = run_engine(
        make_engine(qwen2_dir, block_size=4),
        [prompt],
        SamplingParams(max_tokens=12, temperature=1.0, top_p=0.9, seed=43, ignore_eos=True),
    )[0]
    assert other_seed.token_ids != alone.token_ids


def test_stop_on_eos_and_stop_tokens(qwen2_dir):
    engine = make_engine(qwen2_dir, block_size=4)
    free = run_engine(engine, [[5, 6, 7]], SamplingParams(max_tokens=8, ignore_eos=True))[0]
    stop_at = free.token_ids[3]
    stopped = run_engine(
        engine, [[5, 6, 7]], SamplingParams(max_tokens=8, stop_token_ids=(stop_at,)), prefix="s"
    )[0]
    assert stopped.token_ids == free.token_ids[: free.token_ids.index(stop_at) + 1]
    assert stopped.finish_reason == "stopped"
    assert free.finish_reason == "length"


def test_per_request_state_is_released_at_once(qwen2_dir):
    engine = make_engine(qwen2_dir, block_size=4)
    engine.add_request(StageInput("a", [5, 6, 7], SamplingParams(max_tokens=2), extras={"x": 1}))
    engine.add_request(StageInput("b", [5, 6, 8], SamplingParams(max_tokens=9), extras={"x": 2}))
    engine.step()
    engine.abort(["b"])
    engine.run_until_done()
    # Nothing lingers until a next step: inputs can be large (pixels, upstream hidden states).
    assert engine.runner._extras == {} and engine.runner.requests.states == {}
    # The same id again keeps its new inputs.
    engine.add_request(StageInput("a", [5, 6, 7], SamplingParams(max_tokens=2), extras={"x": 3}))
    engine.step()
    assert engine.runner._extras == {"a": {"x": 3}}
    engine.run_until_done()


def _finished(host, num_results: int, timeout_s: float = 60.0) -> list:
    from omni.messages import Finished

    results: list = []
    deadline = time.monotonic() + timeout_s
    while len(results) < num_results and time.monotonic() < deadline:
        results += [e.result for e in host.poll(0.5) if isinstance(e, Finished)]
    assert len(results) == num_results, results
    return results


def _break_second_call(monkeypatch, owner, name: str, message: str) -> None:
    """owner.name raises RuntimeError(message) on its second call, works otherwise."""
    original = getattr(owner, name)
    num_calls = [0]

    def breaks_once(*args):
        num_calls[0] += 1
        if num_calls[0] == 2:
            raise RuntimeError(message)
        return original(*args)

    monkeypatch.setattr(owner, name, breaks_once)


def test_a_failing_step_fails_its_requests_not_the_stage(qwen2_dir, monkeypatch):
    from omni.host import StageHost

    engine = make_engine(qwen2_dir, block_size=4)
    _break_second_call(monkeypatch, engine.runner, "execute", "device fell over")
    host = StageHost(engine.config, {}, engine=engine)
    try:
        host.submit(
            [
                StageInput(f"r{i}", list(range(5, 30)), SamplingParams(max_tokens=4))
                for i in range(3)
            ]
        )
        failed = _finished(host, 3)
        assert sorted(r.request_id for r in failed) == ["r0", "r1", "r2"]
        assert all("device fell over" in r.error and "stage 'llm'" in r.error for r in failed)
        assert engine.kv.num_free_blocks == engine.kv.num_blocks
        assert engine.kv.cached_block_ids() == []
        # An adapter hook tripping over one input (not a ValueError) rejects that request alone.
        monkeypatch.setattr(engine.model, "check_inputs", lambda s: s.extras["missing"])
        host.submit([StageInput("bad", [5, 6], SamplingParams(max_tokens=1))])
        (rejected,) = _finished(host, 1)
        assert "KeyError" in rejected.error and "'bad'" in rejected.error
        monkeypatch.undo()
        host.submit([StageInput("after", [5, 6, 7], SamplingParams(max_tokens=2))])
        (after,) = _finished(host, 1)
        assert after.request_id == "after" and after.error is None and len(after.token_ids) == 2
        assert host.alive
    finally:
        host.shutdown()


def test_a_step_failing_while_it_finishes_requests_fails_them_all(qwen2_dir, monkeypatch):
    """A step whose update raises while building a finished request's result (its rows'
    gather): every request that finished in that step gets an error result, the ones whose
    results were already built included, and the blocks are freed. (Before, those requests
    were released without a result and their callers waited forever.)"""
    from omni.host import StageHost

    engine = make_engine(qwen2_dir, block_size=4)
    _break_second_call(monkeypatch, engine.rows, "finish", "gather fell over")
    host = StageHost(engine.config, {}, engine=engine)
    try:
        host.submit(
            [
                StageInput(f"r{i}", list(range(5 + i, 30)), SamplingParams(max_tokens=3))
                for i in range(3)
            ]
        )
        failed = _finished(host, 3)
        assert sorted(r.request_id for r in failed) == ["r0", "r1", "r2"]
        assert all("gather fell over" in r.error for r in failed)
        assert engine.kv.num_free_blocks == engine.kv.num_blocks
        assert engine.scheduler.requests == {}
        assert host.alive
    finally:
        host.shutdown()
