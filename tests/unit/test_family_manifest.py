"""Model-family manifests (omni/family.py) and how the registry adds them: each checks itself, and
a family that declares a taken name is refused before anything is added. The end-to-end case (a
new family found and run) is tests/integration/test_model_family.py."""

from __future__ import annotations

import pytest

from omni import registry
from omni.family import AdapterSpec, EdgeSpec, EdgeStreaming, ModelFamily, read_manifest


def test_builtin_families_declare_what_omni_knows():
    assert list(registry.MODEL_FAMILIES) == [
        "causal_lm",
        "two_stage",
        "qwen2_5_omni",
        "qwen3_omni_moe",
    ]
    qwen = registry.MODEL_FAMILIES["qwen2_5_omni"]
    assert [a.name for a in qwen.adapters] == [
        "qwen2_5_omni_thinker",
        "qwen2_5_omni_talker",
        "qwen2_5_omni_token2wav",
    ]
    assert (qwen.stage_config, qwen.sample_rate, qwen.model_types) == (
        "qwen2_5_omni",
        24000,
        ("qwen2_5_omni",),
    )
    assert registry.family_of("qwen2_5_omni_talker") is qwen
    assert registry.family_of("embeds_lm") is registry.MODEL_FAMILIES["two_stage"]
    assert registry.family_for_model_type("qwen2_5_omni") is qwen
    assert registry.family_for_model_type("llama") is None  # the causal-LM fallback claims none
    assert read_manifest("stages.qwen2_5_omni.family") == qwen  # read again: an equal manifest
    qwen3 = registry.MODEL_FAMILIES["qwen3_omni_moe"]
    assert registry.family_for_model_type("qwen3_omni_moe") is qwen3
    assert [a.name for a in qwen3.adapters] == [
        "qwen3_omni_moe_thinker",
        "qwen3_omni_moe_talker",
        "qwen3_omni_moe_code2wav",
    ]


def test_manifests_check_themselves():
    lm = AdapterSpec("lm", "m:A")
    with pytest.raises(ValueError, match="model family 'f': adapters repeats \\['lm'\\]"):
        ModelFamily("f", adapters=(lm, lm))
    with pytest.raises(ValueError, match="adapters holds AdapterSpecs, got 'lm'"):
        ModelFamily("f", adapters=("lm",))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="prompt_processor: target must be 'module:attr'"):
        ModelFamily("f", prompt_processor="m.Processor")
    with pytest.raises(ValueError, match="sample_rate must be a positive int, got 0"):
        ModelFamily("f", sample_rate=0)
    with pytest.raises(ValueError, match="input processor 'e': stream.delta: target must be"):
        EdgeSpec("e", "m:f", EdgeStreaming(1, False, "m.delta"))
    assert ModelFamily("f", model_types=["x"]).model_types == ("x",)  # type: ignore[arg-type]


def _manifest(root, name: str, manifest: str | None) -> str:
    """A package `name` in `root` with its manifest module (none when `manifest` is None)."""
    (root / name).mkdir()
    (root / name / "__init__.py").write_text(
        "raise ImportError('a manifest is read, not imported')\n"
    )
    if manifest is not None:
        (root / name / "family.py").write_text(
            "from omni.family import AdapterSpec, EdgeSpec, ModelFamily\n" + manifest
        )
    return f"{name}.family"


def test_a_family_that_takes_a_name_is_refused_whole(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    before = (dict(registry.ADAPTER_SPECS), dict(registry.MODEL_FAMILIES))
    clash = _manifest(
        tmp_path,
        "clash_family",
        "FAMILY = ModelFamily('clash', adapters=(AdapterSpec('fresh', 'm:A'), "
        "AdapterSpec('causal_lm', 'm:B')), edges=(EdgeSpec('hidden_to_embeds', 'm:f'),), "
        "model_types=('qwen2_5_omni',))\n",
    )
    with pytest.raises(ValueError) as e:
        registry.add_family(clash)
    assert str(e.value) == (
        "model family 'clash' (clash_family.family): already declared: adapter 'causal_lm', input "
        "processor 'hidden_to_embeds', model_type 'qwen2_5_omni' (by qwen2_5_omni)"
    )
    assert before == (registry.ADAPTER_SPECS, registry.MODEL_FAMILIES)  # nothing added
    with pytest.raises(ValueError, match="model family 'qwen2_5_omni' .*: the name is taken"):
        registry.add_family(_manifest(tmp_path, "again", "FAMILY = ModelFamily('qwen2_5_omni')\n"))
    with pytest.raises(ValueError, match="must bind FAMILY = ModelFamily"):
        registry.add_family(_manifest(tmp_path, "unbound", "family = None\n"))
    with pytest.raises(ValueError, match="'bare.family': no module 'family' found"):
        registry.add_family(_manifest(tmp_path, "bare", None))
    with pytest.raises(ValueError, match="'nowhere.sub': no package 'nowhere' found"):
        registry.add_family("nowhere.sub")
