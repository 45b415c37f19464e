"""The two-stage pipeline on the local backend (no Ray): equal to driving the engines by hand,
equal with caching on and off, served from both stages' caches on a repeat, and a request that
fails in a stage fails alone, while a dead stage (a CUDA error) is reported as such."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest
from helpers import on_cpu
from two_stage_support import assert_same, direct_run, prompts, two_stage_config

from omni.core.sampling_params import SamplingParams
from omni.engine.stage_engine import StageEngine
from omni.entrypoints.omni import Omni
from omni.messages import PromptInput, StageInput
from omni.registry import get_input_processor, register_input_processor
from stages.two_stage import hidden_to_embeds

pytestmark = pytest.mark.slow


@register_input_processor("test_local_faulty")
def faulty(upstream, prompt):
    """hidden_to_embeds, but broken on purpose for requests salted "raise" or "misshape"."""
    if prompt.cache_salt == "raise":
        raise RuntimeError("deliberately broken for this request")
    stage_input = hidden_to_embeds(upstream, prompt)
    if prompt.cache_salt == "misshape":
        stage_input.extras["prompt_embeds"] = stage_input.extras["prompt_embeds"][:-1]
    return stage_input


@pytest.fixture(scope="module")
def dirs(qwen2_dir, llama_dir):
    return qwen2_dir, llama_dir


@pytest.fixture(scope="module")
def local_omni(dirs):
    with Omni(two_stage_config(*dirs, **{"runtime.backend": "local"})) as omni:
        yield omni


def test_local_pipeline_equals_direct_engines(dirs, local_omni):
    ids = prompts()
    want = direct_run(local_omni.config, ids)
    outputs = local_omni.generate(ids, use_tqdm=False)
    assert [o.request_id for o in outputs] == sorted(
        (o.request_id for o in outputs), key=lambda r: int(r.split("-")[1])
    )
    for i, (output, expected) in enumerate(zip(outputs, want, strict=True)):
        assert output.error is None and output.final is output.stages["b"]
        assert_same(output.stages, expected, f"prompt {i}")
        assert output.final.text is not None


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["padded", "ahead"])
def test_padded_steps_of_b_equal_its_eager_ones(dirs, async_scheduling):
    """Stage b's prompt positions take a's projected rows, which its padded (CUDA-graph) body
    does not add: those steps run eagerly, the decode steps padded. Each request alone (a lone
    short prefill has a suffix's shape), then again (a prefix hit leaves one prompt token to
    feed, a decode step's shape), then all at once; b's tokens equal the eager engines'."""
    config = two_stage_config(*dirs)
    ids = prompts()
    want = direct_run(config, ids)
    padded = {"cuda_graphs": True, "async_scheduling": async_scheduling}
    b_config = config.stage("b")
    b_config = dataclasses.replace(b_config, engine=dataclasses.replace(b_config.engine, **padded))
    engine = StageEngine(b_config)
    edge = get_input_processor(b_config.input_processor)
    inputs = [
        edge({"a": w["a"]}, PromptInput(f"r{i}", p))
        for i, (p, w) in enumerate(zip(ids, want, strict=True))
    ]
    rounds = [[[x] for x in inputs], [[x] for x in inputs], [inputs]]  # alone, hits, together
    for number, batches in enumerate(rounds):
        for batch in batches:
            for x in batch:
                request = dataclasses.replace(x, request_id=f"{number}-{x.request_id}")
                engine.add_request(dataclasses.replace(request, sampling_params=b_config.sampling))
            for result in engine.run_until_done():
                index = int(result.request_id.rsplit("r", 1)[1])
                assert result.token_ids == want[index]["b"].token_ids, result.request_id
    stats = engine.stats()
    assert stats["padded_decode_steps"] > 0 and stats["kv_hit_tokens"] > 0, stats
    assert (stats["steps_launched_ahead"] > 0) == async_scheduling, stats


def test_stream_yields_each_stage_as_it_finishes(local_omni):
    ids = prompts(n=3, seed=1)
    seen = [(r.request_id, r.stage) for r in local_omni.stream(ids)]
    assert len(seen) == 2 * len(ids)
    for request_id in {request_id for request_id, _ in seen}:
        assert [s for r, s in seen if r == request_id] == ["a", "b"]


def test_leaving_a_stream_early_aborts_the_rest(local_omni):
    long = SamplingParams(max_tokens=200, ignore_eos=True)
    stream = local_omni.stream(prompts(n=4, seed=2), long)
    first = next(stream)
    assert first.stage == "a" and first.error is None
    stream.close()
    # The aborts are asynchronous (the stream's tasks end on the event loop, hosts apply aborts
    # between steps), and a request between stages shows in no stage's stats while the router
    # still holds it: wait until nothing holds it anywhere.
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        num_routed = local_omni.async_omni.num_requests
        stats = local_omni.stats()
        busy = any(s["num_requests"] or s["kv_blocks_in_use"] for s in stats.values())
        if num_routed == 0 and not busy:
            break
        time.sleep(0.1)
    assert num_routed == 0, stats
    assert all(s["num_requests"] == 0 for s in stats.values())
    assert all(s["kv_blocks_in_use"] == 0 for s in stats.values())


def test_per_stage_sampling_params(local_omni):
    params = [SamplingParams(max_tokens=3, ignore_eos=True), SamplingParams(max_tokens=5)]
    (output,) = local_omni.generate([prompts()[0]], params, use_tqdm=False)
    assert len(output.stages["a"].token_ids) == 3
    assert 1 <= len(output.stages["b"].token_ids) <= 5
    with pytest.raises(ValueError, match="one per stage"):
        local_omni.generate([[5, 6, 7]], [SamplingParams()], use_tqdm=False)


def test_caching_on_equals_off_and_repeat_hits_both_caches(dirs, local_omni):
    prompt = prompts(n=1, seed=7)[0] * 3  # a longer prompt nobody sent before
    first = local_omni.generate([prompt], use_tqdm=False)[0]
    second = local_omni.generate([prompt], use_tqdm=False)[0]
    for stage in ("a", "b"):
        assert first.stages[stage].num_cached_tokens == 0, stage
        assert second.stages[stage].num_cached_tokens > 0, stage
    off = {
        "runtime.backend": "local",
        "stages.a.engine.enable_prefix_caching": False,
        "stages.b.engine.enable_prefix_caching": False,
    }
    with Omni(two_stage_config(*dirs, **off)) as uncached:
        for _ in range(2):
            (plain,) = uncached.generate([prompt], use_tqdm=False)
            assert all(r.num_cached_tokens == 0 for r in plain.stages.values())
            assert_same(second.stages, plain.stages, "caching on vs off")
    stats = local_omni.stats()
    assert stats["a"]["kv_hit_tokens"] > 0 and stats["b"]["kv_hit_tokens"] > 0


def test_failing_request_fails_alone(dirs):
    config = two_stage_config(
        *dirs, **{"runtime.backend": "local", "stages.b.input_processor": "test_local_faulty"}
    )
    ids = prompts(n=3, seed=2)
    batch = [{"prompt_token_ids": ids[0]}, {"prompt_token_ids": ids[1], "cache_salt": "raise"}]
    batch += [{"prompt_token_ids": ids[2], "cache_salt": "misshape"}, {"prompt_token_ids": ids[3]}]
    with Omni(config) as omni:
        outputs = omni.generate(batch, use_tqdm=False)
    ok, raised, misshaped, ok2 = outputs
    assert ok.error is None and ok2.error is None and len(ok2.final.token_ids) == 6
    request_id = raised.request_id
    assert raised.final.stage == "b" and "a" in raised.stages
    assert f"{request_id!r}" in raised.error and "stage 'b'" in raised.error
    assert "test_local_faulty" in raised.error and "deliberately broken" in raised.error
    assert f"{misshaped.request_id!r}" in misshaped.error and "stage 'b'" in misshaped.error
    assert "prompt_embeds" in misshaped.error


@register_input_processor("test_generated_tokens")
def generated_tokens(upstream, prompt):
    """The upstream stages' generated tokens, concatenated in stage-name order."""
    ids = [t for name in sorted(upstream) for t in upstream[name].token_ids]
    request_id = next(iter(upstream.values())).request_id
    return StageInput(request_id, ids, cache_salt=prompt.cache_salt)


def test_diamond_graph_waits_for_all_inputs(dirs):
    qwen2, llama = dirs
    engine = {"block_size": 4, "num_blocks": 64, "device": "cpu"}
    sampling = {"max_tokens": 3, "ignore_eos": True}

    def stage(name, model, inputs=()):
        processor = "test_generated_tokens" if inputs else None
        return {
            "name": name,
            "model": model,
            "inputs": list(inputs),
            "engine": engine,
            "input_processor": processor,
            "sampling": sampling,
        }

    config = {
        "runtime": {"backend": "local"},
        "stages": [
            stage("d", qwen2, ["b", "c"]),
            stage("a", qwen2),
            stage("b", llama, ["a"]),
            stage("c", qwen2, ["a"]),
        ],
    }
    with Omni(config) as omni:
        assert omni.order == ["a", "b", "c", "d"]
        outputs = omni.generate([[5, 6, 7, 8, 9], [10, 11, 12]], use_tqdm=False)
        streamed = [r.stage for r in omni.stream([[13, 14, 15]])]
    for output in outputs:
        s = output.stages
        assert output.error is None and output.final is s["d"] and set(s) == {"a", "b", "c", "d"}
        assert s["b"].prompt_token_ids == s["a"].token_ids == s["c"].prompt_token_ids
        assert s["d"].prompt_token_ids == s["b"].token_ids + s["c"].token_ids
    assert streamed[0] == "a" and streamed[-1] == "d" and sorted(streamed) == ["a", "b", "c", "d"]


def test_yaml_with_variables_and_overrides(dirs):
    repo = Path(__file__).resolve().parents[2]
    variables = {"MODEL_A": str(dirs[0]), "MODEL_B": str(dirs[1])}
    with Omni(
        repo / "stage_configs" / "tiny_two_stage.yaml",
        variables=variables,
        runtime={"backend": "local"},
        **{"stages.a.engine.num_blocks": 64, **on_cpu("a", "b")},
    ) as omni:
        assert omni.config.stage("a").engine.num_blocks == 64
        assert omni.config.stage("b").model == variables["MODEL_B"]
        (out,) = omni.generate("a short prompt", use_tqdm=False)
        assert out.error is None and out.final.token_ids


@pytest.mark.parametrize(
    ("prompt", "fragment"),
    [
        ([5, -1], "prompt_token_ids[1] = -1"),
        ([5, "x"], "prompt_token_ids[1] = 'x'"),
        ([5, 2.0], "prompt_token_ids[1] = 2.0"),
        ([True, 5], "prompt_token_ids[0] = True"),
        ({"prompt": ""}, "'prompt' must be a non-empty string"),
        ({"prompt": "a", "colour": 1}, "unknown key(s) ['colour']"),
    ],
)
def test_bad_prompts_raise_before_any_work(local_omni, prompt, fragment):
    steps_before = {name: s["steps"] for name, s in local_omni.stats().items()}
    with pytest.raises(ValueError) as info:
        local_omni.generate(["a fine prompt", prompt], use_tqdm=False)
    assert fragment in str(info.value)
    assert {name: s["steps"] for name, s in local_omni.stats().items()} == steps_before


class _LoopKiller(BaseException):
    """Not an Exception: escapes the per-step recovery and ends the stage's loop thread."""


@pytest.mark.parametrize("stage_threads", ["shared", "per_stage"])
def test_a_dead_stage_is_reported_not_waited_on(dirs, stage_threads):
    """Whether stage b steps on the shared thread or on its own (a GPU stage's)."""
    overrides = {"runtime.backend": "local", "runtime.stage_threads": stage_threads}
    with Omni(two_stage_config(*dirs, **overrides)) as omni:
        assert omni.backend.hosts["b"].threaded == (stage_threads == "per_stage")
        omni.check_health()
        engine = omni.backend.hosts["b"].engine

        def die():
            raise _LoopKiller("the stage's thread is gone")

        engine.step = die
        (out,) = omni.generate([prompts()[0]], use_tqdm=False)
        assert out.error is not None and out.final.stage == "b"
        assert "stage 'b': engine loop died: _LoopKiller" in out.error
        with pytest.raises(RuntimeError, match="stage 'b': engine loop died"):
            omni.check_health()
        with pytest.raises(RuntimeError, match="stage 'b': engine loop died"):
            omni.generate([prompts()[1]], use_tqdm=False)


def test_a_cuda_error_in_a_forward_is_the_stage_s_death(dirs):
    """Stage b's adapter raises what torch raises after a device-side assert (a test double of
    the failure, injected into its forward): b is reported dead, the requests in it fail naming
    it and the error, later ones are refused at once; stage a goes on; nothing waits."""
    with Omni(two_stage_config(*dirs, **{"runtime.backend": "local"})) as omni:
        (fine,) = omni.generate([prompts()[0]], use_tqdm=False)
        assert fine.error is None
        model = omni.backend.hosts["b"].engine.model

        def device_assert(inputs):
            raise RuntimeError("CUDA error: device-side assert triggered")

        model.forward = device_assert
        start = time.monotonic()
        outputs = omni.generate(prompts(n=2, seed=3)[:2], use_tqdm=False)
        assert time.monotonic() - start < 60
        for out in outputs:
            assert out.final.stage == "b" and out.stages["a"].error is None
            assert out.error.endswith(
                "stage 'b': died of a CUDA error, which leaves its GPU context unusable: "
                "RuntimeError: CUDA error: device-side assert triggered"
            )
        assert omni.backend.hosts["a"].alive and not omni.backend.hosts["b"].alive
        with pytest.raises(RuntimeError, match="stage 'b': died of a CUDA error"):
            omni.generate([prompts()[1]], use_tqdm=False)
        assert omni.backend.hosts["a"].alive and omni.stats()["a"]["num_requests"] == 0
