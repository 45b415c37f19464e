"""Stage-config schema: loading, overrides, variables, and one test per validation error."""

from __future__ import annotations

import dataclasses
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from omni.config import (
    ConfigError,
    EngineConfig,
    OmniConfig,
    ResourcesConfig,
    RuntimeConfig,
    StageConfig,
    check_resources,
    config_for_model,
    load_config,
)
from omni.core.sampling_params import SamplingParams
from tests.unit.config_support import CONFIGS, REPO, error_of, make_model, one, stage

pytestmark = pytest.mark.usefixtures("join_processor")


@pytest.fixture
def model(tmp_path: Path) -> str:
    return make_model(tmp_path / "ckpt")


# ---- defaults, immutability, round trip -------------------------------------------------------


def test_defaults(model):
    config = load_config(one(model))
    assert config.runtime == RuntimeConfig()
    assert config.runtime.backend == "ray" and config.runtime.request_timeout_s == 600.0
    a = config.stage("a")
    assert (a.kind, a.adapter, a.inputs, a.input_processor) == ("ar", "causal_lm", (), None)
    # Resolved by load_config: the checkpoint has no max_position_embeddings, and a final stage
    # keeps no per-token outputs unless asked.
    assert a.engine == dataclasses.replace(EngineConfig(), max_model_len=4096, outputs=())
    assert (a.engine.block_size, a.engine.num_blocks, a.engine.kv_cache_memory) == (16, None, 0.1)
    assert a.engine.hash_algo == "xxhash" and a.engine.dtype is None and a.engine.device == "auto"
    assert a.engine.resolved_dtype(on_gpu=False) == "float32"
    assert a.engine.resolved_dtype(on_gpu=True) == "bfloat16"
    assert a.engine.fused_kernels is None
    assert a.engine.resolved_fused_kernels(on_gpu=True)
    assert not a.engine.resolved_fused_kernels(on_gpu=False)
    off = dataclasses.replace(a.engine, fused_kernels=False)
    assert not off.resolved_fused_kernels(on_gpu=True)
    on = dataclasses.replace(a.engine, fused_kernels=True)
    assert not on.resolved_fused_kernels(on_gpu=False)  # the CPU keeps transformers' modules
    assert a.engine.outputs_cached and a.num_threads == 1
    assert a.resources == ResourcesConfig(num_cpus=1.0, num_gpus=None, custom={})
    assert a.sampling == SamplingParams()
    # An empty YAML section (`engine:`) loads as None and means all defaults.
    assert load_config(one(model, engine=None, sampling=None)).stage("a") == a


def test_derived_values(model):
    engine = EngineConfig(enable_prefix_caching=False)
    assert not engine.outputs_cached
    assert EngineConfig(cache_outputs=False).outputs_cached is False
    a = load_config(one(model, resources={"num_cpus": 2.5})).stage("a")
    assert a.num_threads == 2 and a.resources.num_cpus == 2.5
    a = load_config(one(model, engine={"num_threads": 3})).stage("a")
    assert a.num_threads == 3
    custom = ResourcesConfig(num_cpus=0.5, custom={"node_a": 1})
    assert custom.as_ray_resources() == {"CPU": 0.5, "node_a": 1.0}


def test_frozen(model):
    config = load_config(one(model))
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.stages[0].engine.block_size = 4
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.runtime = RuntimeConfig()
    assert pickle.loads(pickle.dumps(config)) == config  # Ray ships configs to the actors


def test_yaml_round_trip(tmp_path, model):
    config = load_config(
        {
            "runtime": {"backend": "local", "log_level": "debug", "num_cpus": 2},
            "stages": [
                stage("a", model, engine={"block_size": 4, "hash_algo": "sha256"}),
                stage("b", model, ["a"], resources={"num_cpus": 0.5, "custom": {"node_a": 1}}),
            ],
        }
    )
    assert config.runtime.log_level == "DEBUG"
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(config.to_dict()))
    assert load_config(path) == config


def test_relative_model_paths(tmp_path, monkeypatch):
    make_model(tmp_path / "conf" / "ckpt")
    path = tmp_path / "conf" / "pipeline.yaml"
    path.write_text(yaml.safe_dump(one("ckpt")))
    monkeypatch.chdir(tmp_path)  # the YAML's directory wins over the cwd for its own paths
    assert load_config(path).stage("a").model == str(tmp_path / "conf" / "ckpt")
    # A dict (and an override) is relative to the cwd.
    make_model(tmp_path / "other")
    assert load_config(one("other")).stage("a").model == str(tmp_path / "other")
    got = load_config(path, ["stages.a.model=other"]).stage("a").model
    assert got == str(tmp_path / "other")
    # A value that starts with a variable takes its base from the variable.
    path.write_text(yaml.safe_dump(one("${ROOT}")))
    assert load_config(path, variables={"ROOT": "other"}).stage("a").model == str(
        tmp_path / "other"
    )


def test_shipped_tiny_config(model):
    config = load_config(CONFIGS / "tiny_causal_lm.yaml", variables={"MODEL": model})
    assert config.final_stage.model == model and config.final_stage.adapter == "causal_lm"
    error_of(CONFIGS / "tiny_causal_lm.yaml", "stages.llm.model", "${MODEL}")


def test_import_is_torch_free():
    code = "import omni.config, sys; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


# ---- overrides and variables ------------------------------------------------------------------


def test_overrides_dotted_dict(model):
    config = load_config(
        one(model), {"stages.a.engine.num_blocks": 512, "runtime.backend": "local"}
    )
    assert config.stage("a").engine.num_blocks == 512 and config.runtime.backend == "local"


def test_overrides_nested_dict_merges(model):
    base = one(model, engine={"block_size": 4})
    config = load_config(
        base, {"runtime": {"backend": "local"}, "stages": {"a": {"engine": {"num_blocks": 8}}}}
    )
    engine = config.stage("a").engine
    assert (engine.block_size, engine.num_blocks, config.runtime.backend) == (4, 8, "local")
    assert base["stages"][0]["engine"] == {"block_size": 4}  # the caller's dict is untouched


def test_overrides_cli_strings(model):
    overrides = [
        "stages.a.engine.num_blocks=512",
        "stages.a.engine.enable_prefix_caching=false",
        "stages.a.sampling.stop_token_ids=[1, 2]",
        "runtime.address=auto",
        "runtime.num_cpus=",
    ]
    config = load_config(one(model), overrides)
    a = config.stage("a")
    assert (a.engine.num_blocks, a.engine.enable_prefix_caching) == (512, False)
    assert a.sampling.stop_token_ids == (1, 2)
    assert (config.runtime.address, config.runtime.num_cpus) == ("auto", None)
    biased = load_config(one(model), ["stages.a.sampling.logit_bias={9: -100, 5: 1.5}"])
    assert biased.stage("a").sampling.logit_bias == ((5, 1.5), (9, -100.0))  # a mapping: pairs


def test_override_errors(model):
    error_of(one(model), "no stage named 'b'", overrides=["stages.b.engine.num_blocks=1"])
    error_of(one(model), "expected KEY=VALUE", overrides=["stages.a.engine.num_blocks"])
    msg = error_of(one(model), overrides={"stages.a.engine.num_blokcs": 3})
    assert "stages.a.engine" in msg and "did you mean 'num_blocks'" in msg


def test_variables(model, tmp_path):
    sub = make_model(tmp_path / "root" / "thinker")
    config = load_config(one("${ROOT}/thinker"), variables={"ROOT": tmp_path / "root"})
    assert config.stage("a").model == sub
    error_of(one("${ROOT}/thinker"), "stage 'a'", "stages.a.model", "${ROOT}", "undefined")


# ---- validation errors: each names the stage, the key path and the value ----------------------


@pytest.mark.parametrize(
    ("extra", "fragments"),
    [
        (
            {"engine": {"blok_size": 4}},
            ["stages.a.engine", "'blok_size'", "did you mean 'block_size'"],
        ),
        ({"input": []}, ["stages.a:", "'input'", "did you mean 'inputs'"]),
        ({"sampling": {"max_token": 3}}, ["stages.a.sampling", "did you mean 'max_tokens'"]),
        ({"engine": {"block_size": "16"}}, ["stages.a.engine.block_size", "'16'", "an integer"]),
        ({"engine": {"num_blocks": True}}, ["stages.a.engine.num_blocks", "True", "an integer"]),
        ({"engine": {"block_size": 1.5}}, ["stages.a.engine.block_size", "1.5"]),
        (
            {"engine": {"enable_prefix_caching": "yes"}},
            ["enable_prefix_caching", "'yes'", "boolean"],
        ),
        ({"resources": {"num_cpus": "two"}}, ["stages.a.resources.num_cpus", "'two'", "number"]),
        ({"inputs": "b"}, ["stages.a.inputs", "'b'", "a list of strings"]),
        ({"engine": {"block_size": 0}}, ["stages.a.engine.block_size", ">= 1", "got 0"]),
        ({"engine": {"num_blocks": 0}}, ["stages.a.engine.num_blocks", "got 0"]),
        ({"engine": {"max_num_seqs": 0}}, ["stages.a.engine.max_num_seqs", "got 0"]),
        ({"engine": {"max_num_batched_tokens": 0}}, ["max_num_batched_tokens", "got 0"]),
        ({"engine": {"max_model_len": -1}}, ["stages.a.engine.max_model_len", "got -1"]),
        ({"engine": {"hash_algo": "md5"}}, ["stages.a.engine.hash_algo", "'md5'", "'sha256'"]),
        ({"engine": {"dtype": "float64"}}, ["stages.a.engine.dtype", "'float64'", "'bfloat16'"]),
        ({"engine": {"num_threads": 0}}, ["stages.a.engine.num_threads", "got 0"]),
        ({"engine": {"fused_kernels": "yes"}}, ["stages.a.engine.fused_kernels", "'yes'"]),
        (
            {"engine": {"enable_prefix_caching": False, "cache_outputs": True}},
            ["stages.a.engine.cache_outputs", "True", "enable_prefix_caching"],
        ),
        ({"kind": "encoder"}, ["stages.a.kind", "'encoder'", "'generation'"]),
        ({"kind": "generation"}, ["stages.a.kind", "'causal_lm' is an ar adapter", "kind: ar"]),
        (
            {"adapter": "qwen2_5_omni_token2wav"},
            ["stages.a.kind", "got 'ar'", "a generation adapter", "set kind: generation"],
        ),
        ({"resources": {"num_cpus": -1}}, ["stages.a.resources.num_cpus", "-1"]),
        ({"resources": {"num_gpus": -0.5}}, ["stages.a.resources.num_gpus", "-0.5"]),
        ({"resources": {"custom": {"node_a": -1}}}, ["stages.a.resources.custom.node_a", "-1"]),
        ({"resources": {"custom": {"CPU": 1}}}, ["stages.a.resources.custom.CPU", "num_cpus"]),
        ({"adapter": "nope"}, ["stages.a.adapter", "'nope'", "'causal_lm'"]),
        ({"input_processor": "join"}, ["stages.a.input_processor", "'join'", "root"]),
        ({"inputs": ["a"]}, ["stages.a.inputs", "['a']", "itself"]),
        ({"sampling": {"top_p": 2}}, ["stages.a.sampling.top_p", "2", "(0, 1]"]),
        ({"sampling": {"max_tokens": 0}}, ["stages.a.sampling.max_tokens", "got 0"]),
        ({"sampling": {"temperature": "hot"}}, ["stages.a.sampling.temperature", "'hot'"]),
        ({"sampling": {"stop_token_ids": [-1]}}, ["stages.a.sampling.stop_token_ids", "-1"]),
        ({"sampling": {"logit_bias": {5: "up"}}}, ["sampling.logit_bias", "integers to finite"]),
        ({"sampling": {"logit_bias": {5: 500}}}, ["stages.a.sampling.logit_bias", "[-100, 100]"]),
    ],
)
def test_stage_field_errors(model, extra, fragments):
    message = error_of(one(model, **extra), *fragments)
    assert message.startswith("stage 'a': stages.a")


@pytest.mark.parametrize(
    ("runtime", "fragments"),
    [
        ({"backend": "k8s"}, ["runtime.backend", "'k8s'", "'local'"]),
        ({"request_timeout_s": 0}, ["runtime.request_timeout_s", "got 0.0"]),
        ({"num_cpus": 0}, ["runtime.num_cpus", "got 0"]),
        ({"log_level": "LOUD"}, ["runtime.log_level", "'LOUD'"]),
        ({"placement": "strict_spread"}, ["runtime.placement", "'none'", "'strict_spread'"]),
        ({"stage_threads": "gpu"}, ["runtime.stage_threads", "'per_stage'", "'gpu'"]),
        ({"adress": "auto"}, ["runtime", "did you mean 'address'"]),
    ],
)
def test_runtime_errors(model, runtime, fragments):
    error_of({"runtime": runtime, **one(model)}, *fragments)


def test_top_level_errors(model):
    error_of({"stage": [], **one(model)}, "'stage'", "did you mean 'stages'")
    error_of({"stages": []}, "stages", "at least one stage")
    error_of({"runtime": {}}, "stages", "must be a list")
    error_of({"stages": [{"model": model}]}, "stages[0].name", "required")
    error_of({"stages": [{"name": "a.b", "model": model}]}, "stages[0].name", "'a.b'", "no dots")
    error_of({"stages": ["a"]}, "stages[0]", "must be a mapping", "'a'")


def test_model_directory_errors(tmp_path):
    missing = str(tmp_path / "missing")
    error_of(one(missing), "stage 'a'", "stages.a.model", missing, "no such")
    (tmp_path / "empty").mkdir()
    error_of(one(str(tmp_path / "empty")), "stages.a.model", "empty", "no config.json")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text("{not json")
    error_of(one(str(bad)), "stages.a.model", "cannot read", "config.json")
    assert load_config(one(missing), check_models=False).stage("a").model == missing


def test_graph_errors(model):
    two = [stage("a", model), stage("a", model)]
    error_of({"stages": two}, "stages", "duplicate stage name 'a'")
    dangling = [stage("thinker", model), stage("talker", model, ["thinkr"])]
    error_of(
        {"stages": dangling},
        "stage 'talker'",
        "stages.talker.inputs",
        "'thinkr'",
        "did you mean 'thinker'",
    )
    cycle = [stage("a", model, ["b"]), stage("b", model, ["a"]), stage("c", model, ["b"])]
    message = error_of({"stages": cycle}, "inputs", "cycle")
    assert "a -> b -> a" in message or "b -> a -> b" in message
    no_proc = [stage("a", model), stage("b", model, ["a"], input_processor=None)]
    error_of({"stages": no_proc}, "stage 'b'", "stages.b.input_processor", "None", "inputs")
    bad_proc = [stage("a", model), stage("b", model, ["a"], input_processor="zip")]
    error_of({"stages": bad_proc}, "stages.b.input_processor", "'zip'", "'join'")
    forks = [stage("a", model), stage("b", model, ["a"]), stage("c", model, ["a"])]
    error_of({"stages": forks}, "several final stages", "'b'", "'c'")


def test_direct_construction_validates(model):
    with pytest.raises(
        ValueError, match=r"EngineConfig.block_size: must be an integer >= 1, got 0"
    ):
        EngineConfig(block_size=0)
    with pytest.raises(ValueError, match=r"ResourcesConfig.num_cpus"):
        ResourcesConfig(num_cpus="1")
    with pytest.raises(ConfigError, match="at least one stage"):
        OmniConfig()
    stage_a = StageConfig(name="a", model=model, inputs=["b"], input_processor="join")
    assert stage_a.inputs == ("b",)
    with pytest.raises(ConfigError, match="unknown stage 'b'"):
        OmniConfig(stages=(stage_a,))


# ---- graph helpers ----------------------------------------------------------------------------


def test_diamond_topological_order(model):
    stages = [
        stage("d", model, ["b", "c"]),
        stage("c", model, ["a"]),
        stage("b", model, ["a"]),
        stage("a", model),
    ]
    config = load_config({"stages": stages})
    assert config.topological_order() == ["a", "c", "b", "d"]  # ties keep config order
    assert config.final_stage.name == "d"
    assert [s.name for s in config.root_stages] == ["a"]
    assert [s.name for s in config.consumers("a")] == ["c", "b"]
    assert config.stage_names == ["d", "c", "b", "a"]
    with pytest.raises(ValueError, match="did you mean 'a'"):
        config.stage("aa")


# ---- config_for_model and resources -----------------------------------------------------------


def test_config_for_model(tmp_path):
    model = make_model(tmp_path / "lm", {"model_type": "qwen2", "max_position_embeddings": 512})
    config = config_for_model(model)
    (only,) = config.stages
    assert (only.name, only.model, only.adapter, only.inputs) == ("llm", model, "causal_lm", ())
    assert only.engine.max_model_len == 512
    big = make_model(tmp_path / "big", {"max_position_embeddings": 32768})
    assert config_for_model(big).stage("llm").engine.max_model_len == 32768  # not capped
    tuned = config_for_model(big, ["stages.llm.engine.num_blocks=64"])
    assert tuned.stage("llm").engine.num_blocks == 64
    with pytest.raises(ValueError, match="no config.json"):
        config_for_model(tmp_path)


def test_check_resources(model):
    config = load_config(
        {
            "stages": [
                stage("a", model, resources={"num_cpus": 1, "custom": {"node_a": 1}}),
                stage("b", model, ["a"], resources={"num_cpus": 0.5, "num_gpus": 1}),
            ]
        }
    )
    node_a = {"CPU": 2.0, "GPU": 0.0, "node_a": 1.0, "memory": 1e9}
    node_b = {"CPU": 2.0, "GPU": 1.0}
    check_resources(config, [node_a, node_b])
    with pytest.raises(ValueError, match=r"stage 'b'.*resources.num_gpus.*GPU=1"):
        check_resources(config, [node_a, {"CPU": 2.0}])
    with pytest.raises(ValueError, match=r"stage 'a'.*resources.custom.node_a.*node_a=1"):
        check_resources(config, [node_b])
    with pytest.raises(ValueError, match=r"stage 'a'.*no single node has all of CPU=1, node_a=1"):
        check_resources(config, [{"CPU": 0.5, "node_a": 1.0}, {"CPU": 2.0, "GPU": 1.0}])


def test_check_resources_total(model):
    third = {"num_cpus": 1 / 3}
    stages = [
        stage("a", model, resources=third),
        stage("b", model, ["a"], resources=third),
        stage("c", model, ["b"], resources=third),
    ]
    check_resources(load_config({"stages": stages}), [{"CPU": 1.0}])  # rounding tolerated
    for s in stages:
        s["resources"] = {"num_cpus": 1}
    with pytest.raises(ValueError, match=r"CPU=3 in total.*CPU=2"):
        check_resources(load_config({"stages": stages}), [{"CPU": 2.0}])


def test_outputs_default_to_what_consumers_need(model, join_processor):
    two = {
        "stages": [
            {"name": "a", "model": model},
            {"name": "b", "model": model, "inputs": ["a"], "input_processor": "join"},
        ]
    }
    config = load_config(two)
    assert config.stage("a").engine.outputs == ("hidden_states",)  # b consumes a
    assert config.stage("b").engine.outputs == ()  # the final stage keeps none unless asked
    asked = load_config(two, {"stages.b.engine.outputs": ["hidden_states"]})
    assert asked.stage("b").engine.outputs == ("hidden_states",)
    error_of(one(model, engine={"kv_cache_memory": 0}), "engine.kv_cache_memory", "got 0")
