"""engine.async_scheduling on the CPU: decode steps launched one ahead of reading their ids (the
padded steps run eagerly here, the same bookkeeping as on a GPU, with nothing to overlap). Greedy
tokens equal transformers' generate, and seeded samples equal the synchronous engine's, through
stops on a token in flight, aborts while a step is in flight, preemption and prefix caching."""

import pytest
from helpers import make_engine, run_engine, shared_prefix_prompts, transformers_greedy

from omni.config.validate import ConfigError
from omni.core.sampling_params import SamplingParams
from omni.messages import StageInput

pytestmark = pytest.mark.slow
MAX_NEW = 16
GREEDY = SamplingParams(max_tokens=MAX_NEW, ignore_eos=True)
ASYNC = {"block_size": 4, "cuda_graphs": True, "async_scheduling": True, "max_num_seqs": 6}


@pytest.fixture(scope="module")
def case(qwen2_dir):
    from transformers import AutoConfig

    prompts = shared_prefix_prompts(AutoConfig.from_pretrained(qwen2_dir).vocab_size)
    return qwen2_dir, prompts, transformers_greedy(qwen2_dir, prompts, MAX_NEW)


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"num_blocks": 48, "max_model_len": 192},
        {"enable_prefix_caching": False},
        {"max_graph_batch": 4},
    ],
    ids=["pool", "tiny-pool", "no-caching", "capped-ladder"],
)
def test_tokens_equal_transformers(case, extra):
    model_dir, prompts, expected = case
    engine = make_engine(model_dir, **ASYNC, **extra)
    for round_ in ("a", "b"):  # the second round hits the blocks the first one cached
        results = run_engine(engine, prompts, GREEDY, prefix=round_)
        for index, (result, want) in enumerate(zip(results, expected, strict=True)):
            assert result.token_ids == want, f"{round_}{index}"
            assert result.finish_reason == "length"
    stats = engine.stats()
    if "num_blocks" in extra:  # the pool, not the batch, is short: fewer steps run ahead
        assert stats["preemptions"] > 0 and stats["steps_launched_ahead"] > 0, stats
    elif "max_graph_batch" in extra:  # batches above 4 run eagerly, so none of them ahead
        assert 0 < stats["steps_launched_ahead"] < stats["steps"] // 2, stats
    else:  # also while requests wait for a place: 6 of 13 run, a full batch admits nobody
        assert stats["steps_launched_ahead"] > stats["steps"] * 3 // 4, stats
    if extra.get("enable_prefix_caching", True):
        assert stats["kv_hit_tokens"] > 0, stats


def test_a_stop_token_in_flight_ends_the_request_there(case):
    """Each request stops on its 5th greedy token (as a stop token), which the engine learns
    only after the step that feeds it was launched: the output ends there all the same."""
    model_dir, prompts, expected = case
    engine = make_engine(model_dir, **ASYNC)
    for index, (prompt, want) in enumerate(zip(prompts, expected, strict=True)):
        params = SamplingParams(max_tokens=MAX_NEW, ignore_eos=True, stop_token_ids=[want[4]])
        engine.add_request(StageInput(f"s{index}", prompt, params))
    results = {r.request_id: r for r in engine.run_until_done()}
    for index, want in enumerate(expected):
        result = results[f"s{index}"]
        cut = want.index(want[4]) + 1  # its first occurrence
        assert result.token_ids == want[:cut], index
        assert result.finish_reason == "stopped"
    assert engine.stats()["steps_launched_ahead"] > 0
    assert engine.kv.num_free_blocks == engine.num_blocks  # every block came back
    # The pool's cached blocks hold only real tokens: a second round hits and agrees.
    again = run_engine(engine, prompts, GREEDY, prefix="again")
    assert [r.token_ids for r in again] == expected


def test_each_update_carries_the_token_its_step_read(case):
    """What a step reports to the next stage and the caller is the token it read, never the
    placeholder of the step it left in flight: the updates join to the result, stops in flight
    included (a placeholder is 0, which no expected token here is)."""
    model_dir, prompts, expected = case
    assert all(0 not in want for want in expected)
    engine = make_engine(model_dir, **ASYNC)
    for index, (prompt, want) in enumerate(zip(prompts, expected, strict=True)):
        stop = [want[6]] if index % 2 else []
        params = SamplingParams(max_tokens=MAX_NEW, ignore_eos=True, stop_token_ids=stop)
        engine.add_request(StageInput(f"u{index}", prompt, params))
    streamed: dict[str, list[int]] = {}
    results = {}
    while engine.has_unfinished:
        out = engine.step()
        for update in out.updates:
            streamed.setdefault(update.request_id, []).extend(update.new_token_ids)
        results.update({r.request_id: r for r in out.finished})
    assert engine.stats()["steps_launched_ahead"] > 0
    for index, want in enumerate(expected):
        result = results[f"u{index}"]
        assert result.token_ids == (want[: want.index(want[6]) + 1] if index % 2 else want)
        assert streamed[f"u{index}"] == result.token_ids, index


def test_abort_while_a_step_is_in_flight(case):
    model_dir, prompts, expected = case
    engine = make_engine(model_dir, **ASYNC)
    for index, prompt in enumerate(prompts[:6]):
        engine.add_request(StageInput(f"r{index}", prompt, GREEDY))
    done = {}
    for _ in range(4):
        out = engine.step()
        done.update({r.request_id: r for r in out.finished})
    assert engine.pipeline is not None and engine.pipeline.in_flight
    (aborted,) = engine.abort(["r2"])
    assert aborted.finish_reason == "aborted"
    while engine.has_unfinished:
        done.update({r.request_id: r for r in engine.step().finished})
    assert sorted(done) == ["r0", "r1", "r3", "r4", "r5"]
    for index in (0, 1, 3, 4, 5):
        assert done[f"r{index}"].token_ids == expected[index]
    assert engine.kv.num_free_blocks == engine.num_blocks


def test_a_step_ahead_that_raises_fails_its_requests_not_the_stage(case, monkeypatch):
    """A decode step launched ahead raising, with the step before it in flight (in a stage host,
    which turns the exception into results): every request fails naming the error, no block
    stays held, and the stage serves the next requests with transformers' tokens."""
    import time

    from omni.host import StageHost
    from omni.messages import Finished

    model_dir, prompts, expected = case
    engine = make_engine(model_dir, **ASYNC)
    graphs, calls = engine.runner.decode_graphs, [0]
    run = graphs.run

    def breaks_on_the_third_step_ahead(*args, **kwargs):
        fed_ids = args[4] if len(args) > 4 else kwargs.get("fed_ids")
        calls[0] += fed_ids is not None  # launched before the last step's ids were read
        if calls[0] == 3 and fed_ids is not None:
            raise RuntimeError("the step ahead fell over")
        return run(*args, **kwargs)

    monkeypatch.setattr(graphs, "run", breaks_on_the_third_step_ahead)
    host = StageHost(engine.config, {}, engine=engine)

    def finished(num: int) -> dict:
        results, deadline = {}, time.monotonic() + 60
        while len(results) < num and time.monotonic() < deadline:
            for event in host.poll(0.5):
                if isinstance(event, Finished):
                    results[event.result.request_id] = event.result
        assert len(results) == num, results
        return results

    try:
        host.submit([StageInput(f"f{i}", p, GREEDY) for i, p in enumerate(prompts[:4])])
        failed = finished(4)
        errors = {i: (r.error, r.finish_reason, len(r.token_ids)) for i, r in failed.items()}
        assert all("the step ahead fell over" in (r.error or "") for r in failed.values()), errors
        assert engine.kv.num_free_blocks == engine.num_blocks and not engine.has_unfinished
        host.submit([StageInput(f"g{i}", p, GREEDY) for i, p in enumerate(prompts[:4])])
        served = finished(4)
        assert [served[f"g{i}"].token_ids for i in range(4)] == expected[:4]
        assert host.alive and engine.stats()["steps_launched_ahead"] > 4
    finally:
        host.shutdown()


def test_seeded_samples_equal_the_synchronous_engine(qwen2_dir, case):
    _, prompts, _ = case
    params = [
        SamplingParams(max_tokens=MAX_NEW, ignore_eos=True, temperature=1.0, top_k=20, seed=i)
        for i in range(len(prompts))
    ]
    got = {}
    for mode in (False, True):
        engine = make_engine(qwen2_dir, **{**ASYNC, "async_scheduling": mode})
        for index, (prompt, p) in enumerate(zip(prompts, params, strict=True)):
            engine.add_request(StageInput(f"q{index}", prompt, p))
        got[mode] = {r.request_id: r.token_ids for r in engine.run_until_done()}
    assert got[True] == got[False]


def test_config_errors(qwen2_dir):
    with pytest.raises(ConfigError, match="async_scheduling"):
        make_engine(qwen2_dir, async_scheduling=True, cuda_graphs=False)
    with pytest.raises(ConfigError, match="no padded decode steps"):
        make_engine(qwen2_dir, async_scheduling=True)  # CPU: cuda_graphs null means eager


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_traffic_matches_the_synchronous_engine(qwen2_dir, seed):
    """Staggered arrivals, stop tokens, aborts between steps and a tiny pool (preemption), the
    same events by step for a synchronous and an ahead engine: every request that was not
    aborted ends with the same tokens and finish reason (greedy tokens do not depend on which
    step admitted a request or how it was batched), and every block comes back."""
    import random

    rng = random.Random(seed)
    prompts = shared_prefix_prompts(512, num_prompts=16, seed=seed)
    arrivals = sorted(rng.randrange(0, 24) for _ in prompts)
    params = [
        SamplingParams(
            max_tokens=rng.randrange(1, 14),
            ignore_eos=True,
            stop_token_ids=rng.sample(range(3, 512), 40),  # some stop early, most do not
        )
        for _ in prompts
    ]
    aborts = {rng.randrange(2, 30): f"q{rng.randrange(len(prompts))}" for _ in range(3)}
    ended = {}
    for mode in (False, True):
        engine = make_engine(
            qwen2_dir, **{**ASYNC, "async_scheduling": mode, "num_blocks": 40, "max_model_len": 160}
        )
        results, aborted, step = {}, set(), 0
        while step < 400 and (engine.has_unfinished or step <= max(arrivals)):
            for index, (arrival, prompt) in enumerate(zip(arrivals, prompts, strict=True)):
                if arrival == step:
                    engine.add_request(StageInput(f"q{index}", prompt, params[index]))
            if step in aborts:
                aborted.update(r.request_id for r in engine.abort([aborts[step]]))
            results.update({r.request_id: r for r in engine.step().finished})
            step += 1
        assert not engine.has_unfinished and engine.kv.num_free_blocks == engine.num_blocks
        ended[mode] = {
            request_id: (r.token_ids, r.finish_reason)
            for request_id, r in results.items()
            if request_id not in aborted
        }
        if mode:  # the paths under test were taken: steps ahead, and stops on a stop token
            assert engine.stats()["steps_launched_ahead"] > 0
            assert any(reason == "stopped" for _, reason in ended[mode].values())
    both = ended[False].keys() & ended[True].keys()
    assert len(both) >= len(prompts) - 3
    assert {k: ended[False][k] for k in both} == {k: ended[True][k] for k in both}
