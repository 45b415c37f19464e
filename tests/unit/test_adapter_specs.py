"""Adapter specs: a stage's kind and its checkpoint are checked against its adapter's spec
before any model code loads."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from omni.config import ConfigError, StageConfig, config_for_model, load_config
from omni.registry import ADAPTER_SPECS, ADAPTERS, register_adapter
from tests.unit.config_support import CONFIGS, REPO, error_of, make_model, one, stage

pytestmark = pytest.mark.usefixtures("join_processor")


@pytest.fixture
def model(tmp_path: Path) -> str:
    return make_model(tmp_path / "ckpt")


@pytest.fixture(scope="module")
def omni_dir() -> str:
    from tools.make_tiny_checkpoint import ensure_checkpoint

    return str(ensure_checkpoint("qwen2_5_omni", "tiny", 0))


def load_in_subprocess(source: str, variables: dict[str, str]) -> dict:
    """load_config in a fresh interpreter: its ConfigError (or None) and whether torch or any
    stages module was imported on the way."""
    code = f"""
import json, sys
from omni.config import ConfigError, StageConfig, config_for_model, load_config
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
        "use stage_configs/qwen2_5_omni.yaml or adapter qwen2_5_omni_thinker"
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
        config_for_model(bert)  # no stage_configs/bert.yaml: the causal-LM fallback, refused


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
