"""The device plan (omni/config/devices.py) with injected GPU counts, through the real config
loader: which stages run on a GPU, the fraction of one each takes, its memory share, and the
ConfigErrors (naming the fields) for requests that cannot hold."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from omni.config import ConfigError, load_config
from omni.config.devices import describe_plan, plan_gpus
from tests.unit.config_support import error_of, make_model, one

QWEN_OMNI = Path(__file__).resolve().parents[2] / "stage_configs" / "qwen2_5_omni.yaml"


def _config(backend: str, **stages: object) -> object:
    return load_config(
        {
            "runtime": {"backend": backend},
            "stages": [
                {"name": "a", "model": "m"},
                {"name": "b", "model": "m", "inputs": ["a"], "input_processor": "join"},
                {"name": "c", "model": "m", "inputs": ["b"], "input_processor": "join"},
            ],
        },
        check_models=False,
        overrides={f"stages.{k}": v for k, v in stages.items()},
    )


def _omni(backend: str, **overrides: object) -> object:
    """The shipped qwen2_5_omni.yaml, as Omni(model=DIR) loads it."""
    return load_config(
        QWEN_OMNI,
        {"runtime.backend": backend, **overrides},
        {"MODEL": "m"},
        check_models=False,
    )


def _plan(config, num_gpus: float) -> dict[str, tuple]:
    """stage -> (device, GPU fraction, memory share, dtype), as `omni validate` prints it."""
    planned = plan_gpus(config, num_gpus=num_gpus, what="no GPU here")
    return {
        p.name: (p.device, p.num_gpus, p.gpu_memory_utilization, p.dtype)
        for p in describe_plan(config, planned)
    }


def _approx(plan: dict[str, tuple]) -> dict[str, tuple]:
    return {n: (d, pytest.approx(f), pytest.approx(u), t) for n, (d, f, u, t) in plan.items()}


@pytest.mark.parametrize("backend", ["local", "ray"])
def test_shipped_omni_config_uses_a_gpu_when_there_is_one(backend):
    config = _omni(backend)
    assert all(s.engine.dtype is None for s in config.stages)  # float32 on a CPU, bf16 on a GPU
    assert all(s.resources.num_gpus is None for s in config.stages)
    assert _plan(config, 1) == _approx(
        {
            "thinker": ("cuda", 0.65, 0.585, "bfloat16"),
            "talker": ("cuda", 0.25, 0.225, "bfloat16"),
            "token2wav": ("cuda", 0.1, 0.09, "float32"),  # the vocoder always runs in float32
        }
    )
    # A CPU machine: exactly as before (every stage on the CPU, float32, nothing reserved).
    assert _plan(config, 0) == {n: ("cpu", 0.0, None, "float32") for n in config.stage_names}
    planned = plan_gpus(config, num_gpus=0, what="-")
    assert {s.engine.device for s in planned.stages} == {"cpu"}
    assert {s.resources.num_gpus for s in planned.stages} == {0.0}


@pytest.mark.parametrize("backend", ["local", "ray"])
def test_null_shares_split_one_gpu_and_a_generation_stage_takes_a_small_one(backend):
    nulls = {f"stages.{n}.resources.gpu_share": None for n in ("thinker", "talker", "token2wav")}
    plan = _plan(_omni(backend, **nulls), 1)
    assert plan == _approx(
        {
            "thinker": ("cuda", 0.45, 0.405, "bfloat16"),
            "talker": ("cuda", 0.45, 0.405, "bfloat16"),
            "token2wav": ("cuda", 0.1, 0.09, "float32"),
        }
    )
    # On the CPU the vocoder takes nothing of the GPU: the ar stages split all of it.
    cpu_vocoder = _omni(backend, **nulls, **{"stages.token2wav.engine.device": "cpu"})
    assert _plan(cpu_vocoder, 1) == _approx(
        {
            "thinker": ("cuda", 0.5, 0.45, "bfloat16"),
            "talker": ("cuda", 0.5, 0.45, "bfloat16"),
            "token2wav": ("cpu", 0.0, None, "float32"),
        }
    )


def test_local_planned_stages_split_what_the_others_leave(join_processor):
    # a's share implies 0.5 of the GPU (0.45 / 0.9); b and c split the other half.
    config = _config("local", **{"a.engine.gpu_memory_utilization": 0.45})
    assert _plan(config, 1) == _approx(
        {
            "a": ("cuda", 0.5, 0.45, "bfloat16"),
            "b": ("cuda", 0.25, 0.225, "bfloat16"),
            "c": ("cuda", 0.25, 0.225, "bfloat16"),
        }
    )
    explicit = _config("local", **{"a.resources.num_gpus": 0.4, "b.resources.gpu_share": 0.2})
    assert _plan(explicit, 1) == _approx(
        {
            "a": ("cuda", 0.4, 0.36, "bfloat16"),
            "b": ("cuda", 0.2, 0.18, "bfloat16"),
            "c": ("cuda", 0.4, 0.36, "bfloat16"),
        }
    )


def test_num_gpus_zero_keeps_a_stage_on_the_cpu_on_both_backends(join_processor):
    for backend in ("local", "ray"):
        config = _config(backend, **{"b.resources.num_gpus": 0, "c.engine.dtype": "float32"})
        plan = _plan(config, 1)
        assert plan["b"] == ("cpu", 0.0, None, "float32")
        assert plan["a"] == plan["c"][:3] + ("bfloat16",) == ("cuda", 0.5, 0.45, "bfloat16")
        assert plan["c"][3] == "float32"  # an explicit dtype is kept
        planned = plan_gpus(config, num_gpus=1, what="-")
        assert planned.stage("b").engine.device == "cpu"  # auto made explicit for the engine
        assert planned.stage("a").engine.device == "auto"  # the actor still checks its GPU


def test_ray_fractions_default_to_ninety_percent_and_whole_gpus_to_point_nine(join_processor):
    config = _config(
        "ray",
        **{
            "a.resources.num_gpus": 0.8,
            "b.resources.num_gpus": 1,
            "c.resources.num_gpus": 0.15,
            "c.engine.gpu_memory_utilization": 0.1,
        },
    )
    assert _plan(config, 2) == _approx(
        {
            "a": ("cuda", 0.8, 0.72, "bfloat16"),
            "b": ("cuda", 1.0, 0.9, "bfloat16"),
            "c": ("cuda", 0.15, 0.1, "bfloat16"),
        }
    )
    cpu_stage = _config("ray", **{"a.engine.device": "cpu", "a.resources.num_gpus": 1})
    planned = plan_gpus(cpu_stage, num_gpus=1, what="-")
    assert planned.stage("a").resources.num_gpus == 1  # Ray still reserves what was asked
    assert _plan(cpu_stage, 1)["a"] == ("cpu", 1.0, None, "float32")


def test_ray_with_two_gpus_plans_beside_explicit_fractions(join_processor):
    # With one GPU the planned stages share it with a's 0.6; with two, Ray may place them apart.
    config = _config("ray", **{"a.resources.num_gpus": 0.6})
    assert _plan(config, 1)["b"][1] == pytest.approx(0.2)
    assert _plan(config, 2)["b"][1] == pytest.approx(0.5)


def test_a_whole_gpu_stage_on_a_one_gpu_cluster_leaves_the_planned_ones_nothing(join_processor):
    """Ray with one GPU and a taking all of it: b and c cannot be planned beside it (they were
    given half a GPU each, which Ray could never place)."""
    config = _config("ray", **{"a.resources.num_gpus": 1})
    with pytest.raises(ConfigError, match=r"stages\.b\.resources\.num_gpus: null, but nothing"):
        plan_gpus(config, num_gpus=1, what="-")
    assert _plan(config, 2)["b"][1] == pytest.approx(0.5)  # with two, Ray may place them apart
    with_share = _config("ray", **{"a.resources.num_gpus": 1, "b.resources.gpu_share": 0.2})
    with pytest.raises(ConfigError, match=r"take 1\.2 of it \(> 1\).*num_gpus=1"):
        plan_gpus(with_share, num_gpus=1, what="-")


def test_more_than_one_gpu_for_a_stage_is_a_warning(join_processor, caplog):
    config = _config("ray", **{"a.resources.num_gpus": 2, "b.resources.num_gpus": 1})
    with caplog.at_level("WARNING", logger="omni.config.devices"):
        assert _plan(config, 4)["a"][:2] == ("cuda", 2)
    (record,) = caplog.records
    assert "stages.a.resources.num_gpus=2 reserves 2 GPUs, but the stage computes on one" in (
        record.getMessage()
    )


def test_cuda_requests_that_cannot_hold_name_the_field(join_processor):
    for backend in ("local", "ray"):
        with pytest.raises(
            ConfigError, match=r"stages\.b\.engine\.device: is cuda, but no GPU here"
        ):
            plan_gpus(
                _config(backend, **{"b.engine.device": "cuda"}), num_gpus=0, what="no GPU here"
            )
        zero = _config(backend, **{"b.engine.device": "cuda", "b.resources.num_gpus": 0})
        with pytest.raises(ConfigError, match=r"stages\.b\.resources\.num_gpus: is 0 \(no GPU\)"):
            plan_gpus(zero, num_gpus=1, what="-")


def test_shares_on_one_gpu_above_095_name_the_stages(join_processor):
    local = _config(
        "local", **{"a.engine.gpu_memory_utilization": 0.6, "b.engine.gpu_memory_utilization": 0.3}
    )
    # c's planned fraction: what a (0.667) and b (0.333) leave is nothing.
    with pytest.raises(ConfigError, match=r"stages\.c\.resources\.num_gpus: null, but nothing"):
        plan_gpus(local, num_gpus=1, what="-")
    local = _config(
        "local",
        **{
            "a.resources.num_gpus": 0.7,
            "a.engine.gpu_memory_utilization": 0.7,
            "b.resources.num_gpus": 0.2,
            "c.engine.device": "cuda",
            "c.resources.num_gpus": 0.1,
        },
    )
    with pytest.raises(ConfigError) as caught:
        plan_gpus(local, num_gpus=1, what="-")
    message = str(caught.value)
    assert "sum to 0.97 on one GPU (on the local backend every GPU stage runs on cuda:0)" in message
    assert "stages.a.engine.gpu_memory_utilization=0.7, " in message
    assert "stages.c.engine.gpu_memory_utilization=0.09 (0.9 x resources.num_gpus=0.1)" in message

    split = {"a.resources.num_gpus": 0.6, "b.resources.num_gpus": 0.4, "c.engine.device": "cpu"}
    ray = _config("ray", **split, **{"a.engine.gpu_memory_utilization": 0.6})
    with pytest.raises(ConfigError) as caught:
        plan_gpus(ray, num_gpus=2, what="-")  # two GPUs, but Ray may pack both on one
    message = str(caught.value)
    assert "sum to 0.96 on one GPU (Ray may put these fractions on one GPU)" in message
    assert "stages.a.engine.gpu_memory_utilization=0.6, " in message
    assert "stages.b.engine.gpu_memory_utilization=0.36 (0.9 x resources.num_gpus=0.4)" in message
    fits = _config("ray", **split, **{"a.engine.gpu_memory_utilization": 0.58})
    assert _plan(fits, 1)["a"][2] == 0.58  # 0.58 + 0.36 = 0.94
    apart = _config("ray", **{"a.resources.num_gpus": 0.7, "b.resources.num_gpus": 0.7})
    assert _plan(apart, 2)["a"][2] == pytest.approx(0.63)  # 0.7 + 0.7 never share a GPU
    whole = _config("ray", **{"a.resources.num_gpus": 1, "a.engine.gpu_memory_utilization": 0.97})
    with pytest.raises(ConfigError, match=r"sum to 0.97 on one GPU \(the stage has its GPU"):
        plan_gpus(whole, num_gpus=2, what="-")  # (with one, b and c would have no GPU left)
    over = _config("ray", **{"a.resources.num_gpus": 0.5, "a.engine.gpu_memory_utilization": 0.8})
    with pytest.raises(
        ConfigError, match=r"stages\.a\.engine\.gpu_memory_utilization: 0.8 is more"
    ):
        plan_gpus(over, num_gpus=1, what="-")


def test_gpu_shares_above_one_gpu_are_refused(join_processor):
    config = _config("local", **{"a.resources.gpu_share": 0.7, "b.resources.gpu_share": 0.4})
    with pytest.raises(ConfigError) as caught:
        plan_gpus(config, num_gpus=1, what="-")
    message = str(caught.value)
    assert "take 1.1 of it (> 1)" in message
    assert "stages.a.resources.gpu_share=0.7, stages.b.resources.gpu_share=0.4" in message
    with pytest.raises(ConfigError, match=r"resources\.gpu_share: must be in \(0, 1\]"):
        _config("local", **{"a.resources.gpu_share": 0})


def test_stage_streams(tmp_path):
    """null: own CUDA streams unless a stage keeps its output cache on the GPU (its tensors
    would cross streams); true with such a stage is refused, naming both fields."""
    model = make_model(tmp_path / "ckpt")
    gpu_cache = {"output_cache_device": "cuda"}
    plain = load_config(one(model))
    assert plain.runtime.stage_streams is None and plain.own_streams
    assert not load_config({**one(model, engine=gpu_cache)}).own_streams
    assert not load_config({"runtime": {"stage_streams": False}, **one(model)}).own_streams
    assert load_config({"runtime": {"stage_streams": True}, **one(model)}).own_streams
    error_of(
        {"runtime": {"stage_streams": True}, **one(model, engine=gpu_cache)},
        "runtime.stage_streams",
        "output_cache_device",
    )
    error_of({"runtime": {"stage_streams": "yes"}, **one(model)}, "runtime.stage_streams")


def test_ar_stages_get_the_higher_stream_priority():
    """Token-by-token stages go first on the GPU; a vocoder's long batches wait for free SMs
    (lower number: higher priority; the stream itself is checked in tests/cuda)."""
    from omni.engine.device import stream_priority, use_own_stream

    assert stream_priority("ar") < stream_priority("generation") == 0
    assert use_own_stream(torch.device("cpu"), stream_priority("ar")) is None


def test_the_processes_backend_plans_as_the_local_one(join_processor):
    """Its stages are processes of this machine: every GPU stage on cuda:0, as locally; one
    copy of each stage."""
    shares = {"a.engine.gpu_memory_utilization": 0.5, "b.engine.gpu_memory_utilization": 0.3}
    local = plan_gpus(_config("local", **shares), num_gpus=2, what="-")
    processes = plan_gpus(_config("processes", **shares), num_gpus=2, what="-")
    for a, b in zip(local.stages, processes.stages, strict=True):
        assert (a.resources, a.engine) == (b.resources, b.engine)
    too_much = {
        "a.resources.num_gpus": 0.7,
        "a.engine.gpu_memory_utilization": 0.7,
        "b.resources.num_gpus": 0.2,
        "c.engine.device": "cuda",
        "c.resources.num_gpus": 0.1,
    }  # fmt: skip  (shares 0.7 + 0.18 + 0.09 = 0.97: above 0.95 on one GPU)
    with pytest.raises(
        ConfigError, match="on the processes backend every GPU stage runs on cuda:0"
    ):
        plan_gpus(_config("processes", **too_much), num_gpus=2, what="-")
    with pytest.raises(ConfigError, match=r"stages\.b\.resources\.replicas.*'processes'"):
        _config("processes", **{"b.resources.replicas": 2})
