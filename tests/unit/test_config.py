"""Stage-config schema: loading, overrides, variables, and one test per validation error."""

from __future__ import annotations

import dataclasses
import json
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
from omni.registry import ADAPTER_SPECS, ADAPTERS, register_adapter

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "omni" / "stage_configs"


pytestmark = pytest.mark.usefixtures("join_processor")


def make_model(path: Path, config: dict | None = None) -> str:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config or {"model_type": "llama"}))
    return str(path)


@pytest.fixture
def model(tmp_path: Path) -> str:
    return make_model(tmp_path / "ckpt")


def stage(name: str, model: str, inputs: tuple[str, ...] | str = (), **extra) -> dict:
    listed = inputs if isinstance(inputs, str) else list(inputs)  # a str tests the type check
    out = {"name": name, "model": model, "inputs": listed, **extra}
    if inputs and "input_processor" not in extra:
        out["input_processor"] = "join"
    return out


def one(model: str, **extra) -> dict:
    return {"stages": [stage("a", model, **extra)]}


def error_of(source, *fragments: str, **kwargs) -> str:
    with pytest.raises(ValueError) as info:
        load_config(source, **kwargs)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    return message


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
    assert a.engine.hash_algo == "xxhash" and a.engine.dtype == "float32"
    assert a.engine.outputs_cached and a.num_threads == 1
    assert a.resources == ResourcesConfig(num_cpus=1.0, num_gpus=0.0, custom={})
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


# ---- adapter specs: kind and checkpoint, checked before any model code loads ------------------


@pytest.fixture(scope="module")
def omni_dir() -> str:
    from tools.make_tiny_checkpoint import ensure_checkpoint

    return str(ensure_checkpoint("qwen2_5_omni", "tiny", 0))


def load_in_subprocess(source: str, variables: dict[str, str]) -> dict:
    """load_config in a fresh interpreter: its ConfigError (or None) and whether torch or any
    stages module was imported on the way."""
    code = f"""
import json, sys
from omni.config import ConfigError, load_config
try:
    load_config({source!r}, variables={variables!r})
    error = None
except ConfigError as e:
    error = str(e)
loaded = sorted(m for m in sys.modules if m in ("torch", "transformers") or m.startswith("stages"))
print(json.dumps({{"error": error, "loaded": loaded}}))
"""
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, cwd=REPO, capture_output=True, text=True
    )
    return json.loads(out.stdout.splitlines()[-1])


@pytest.mark.parametrize(
    ("variable", "stage_name", "adapter"),
    [("MODEL_A", "a", "causal_lm"), ("MODEL_B", "b", "embeds_lm")],
)
def test_text_lm_adapters_reject_an_omni_checkpoint_without_torch(
    omni_dir, qwen2_dir, llama_dir, variable, stage_name, adapter
):
    variables = {"MODEL_A": qwen2_dir, "MODEL_B": llama_dir, variable: omni_dir}
    got = load_in_subprocess(str(CONFIGS / "tiny_two_stage.yaml"), variables)
    assert got["loaded"] == []
    assert got["error"] == (
        f"stage {stage_name!r}: stages.{stage_name}.adapter: adapter {adapter!r} cannot load "
        f"{omni_dir!r} (model_type 'qwen2_5_omni', architectures "
        "['Qwen2_5OmniForConditionalGeneration']): it loads *ForCausalLM checkpoints only; "
        "use omni/stage_configs/qwen2_5_omni.yaml or adapter qwen2_5_omni_thinker"
    )
    # The same config with fitting checkpoints loads, still without torch.
    ok = {"MODEL_A": qwen2_dir, "MODEL_B": llama_dir}
    assert load_in_subprocess(str(CONFIGS / "tiny_two_stage.yaml"), ok) == {
        "error": None,
        "loaded": [],
    }


def test_kind_must_match_the_adapter(omni_dir):
    token2wav = {"name": "vocoder", "model": omni_dir, "adapter": "qwen2_5_omni_token2wav"}
    for check_models in (True, False):  # needs no files
        message = error_of({"stages": [token2wav]}, check_models=check_models)
        assert message == (
            "stage 'vocoder': stages.vocoder.kind: got 'ar', but adapter "
            "'qwen2_5_omni_token2wav' is a generation adapter: set kind: generation"
        )
    assert load_config({"stages": [{**token2wav, "kind": "generation"}]}).stages[0].kind == (
        "generation"
    )
    lm = {"name": "llm", "model": omni_dir, "kind": "generation", "adapter": "causal_lm"}
    message = error_of({"stages": [lm]}, check_models=False)
    assert message == (
        "stage 'llm': stages.llm.kind: got 'generation', but adapter 'causal_lm' is an ar "
        "adapter: set kind: ar"
    )
    with pytest.raises(ValueError, match="is a generation adapter"):
        StageConfig(name="v", model=omni_dir, adapter="qwen2_5_omni_token2wav")


def test_omni_adapters_check_the_model_type(tmp_path, omni_dir):
    config = load_config(CONFIGS / "qwen2_5_omni.yaml", variables={"MODEL": omni_dir})
    assert [s.adapter for s in config.stages] == [
        s.adapter for s in config_for_model(omni_dir).stages
    ]
    llama = make_model(
        tmp_path / "llama", {"model_type": "llama", "architectures": ["LlamaForCausalLM"]}
    )
    message = error_of(
        CONFIGS / "qwen2_5_omni.yaml",
        "stage 'thinker'",
        "stages.thinker.adapter",
        "'qwen2_5_omni_thinker'",
        "model_type 'llama'",
        "it loads model_type 'qwen2_5_omni' or 'qwen2_5_omni_thinker' only",
        variables={"MODEL": llama},
    )
    assert message.endswith("; use adapter causal_lm or embeds_lm")
    # A thinker-only checkpoint fits the thinker; no architectures listed proves nothing.
    thinker = make_model(tmp_path / "thinker", {"model_type": "qwen2_5_omni_thinker"})
    load_config({"stages": [stage("t", thinker, adapter="qwen2_5_omni_thinker")]})


def test_causal_lm_rejects_other_heads(tmp_path):
    bert = make_model(
        tmp_path / "bert", {"model_type": "bert", "architectures": ["BertForMaskedLM"]}
    )
    message = error_of(one(bert), "stages.a.adapter", "'causal_lm'", "model_type 'bert'")
    assert message.endswith("it loads *ForCausalLM checkpoints only")  # no fitting adapter: no hint
    with pytest.raises(ConfigError, match="stages.llm.adapter: adapter 'causal_lm' cannot load"):
        config_for_model(bert)  # no omni/stage_configs/bert.yaml: the causal-LM fallback, refused


def test_registered_adapter_spec_is_honoured(tmp_path, model):
    @register_adapter(
        "test_vocoder", kind="generation", produces_text=False, emits=(), model_types=("llama",)
    )
    class Vocoder:
        pass

    @register_adapter("test_lm", requires_causal_lm=True)
    class LM:
        pass

    try:
        assert load_config(one(model, kind="generation", adapter="test_vocoder"))
        error_of(
            one(model, adapter="test_vocoder"), "stages.a.kind", "got 'ar'", "kind: generation"
        )
        qwen = make_model(tmp_path / "qwen", {"model_type": "qwen2", "architectures": ["X"]})
        message = error_of(one(qwen, kind="generation", adapter="test_vocoder"))
        assert message == (
            f"stage 'a': stages.a.adapter: adapter 'test_vocoder' cannot load {qwen!r} "
            "(model_type 'qwen2', architectures ['X']): it loads model_type 'llama' only"
        )
        message = error_of(one(qwen, adapter="test_lm"), "'test_lm'", "*ForCausalLM")
        assert load_config(one(model, adapter="test_lm"))  # {"model_type": "llama"}
    finally:
        for name in ("test_vocoder", "test_lm"):
            ADAPTERS.pop(name, None)
            ADAPTER_SPECS.pop(name, None)


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
