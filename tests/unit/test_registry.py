"""The torch-free registry of stage adapters (one AdapterSpec each) and input processors
(omni/registry.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from omni import registry
from omni.registry import AdapterSpec

REPO = Path(__file__).resolve().parents[2]


pytestmark = pytest.mark.usefixtures("join_processor")


@pytest.fixture
def unregister():
    """Names registered by a test, removed from every table afterwards."""
    names: list[str] = []
    yield names.append
    for name in names:
        registry.ADAPTERS.pop(name, None)
        registry.ADAPTER_SPECS.pop(name, None)


def test_registry_lookup_is_lazy_and_lists_names():
    assert "causal_lm" in registry.known_adapters()
    assert "join" in registry.known_input_processors()
    with pytest.raises(ValueError, match="unknown adapter 'nope'; known: .*causal_lm"):
        registry.get_adapter("nope")
    with pytest.raises(ValueError, match="unknown adapter 'nope'; known: .*causal_lm"):
        registry.get_adapter_spec("nope")
    with pytest.raises(ValueError, match="unknown input processor 'nope'; known: .*join"):
        registry.get_input_processor("nope")
    assert registry.get_input_processor("join")([1]) == [1]


def test_builtin_specs():
    spec = registry.get_adapter_spec
    assert registry.known_adapters() == sorted(
        [
            "causal_lm",
            "embeds_lm",
            "qwen2_5_omni_talker",
            "qwen2_5_omni_thinker",
            "qwen2_5_omni_token2wav",
            "qwen3_omni_moe_code2wav",
            "qwen3_omni_moe_talker",
            "qwen3_omni_moe_thinker",
        ]
    )
    assert [(s.kind, s.produces_text, s.emits) for s in map(spec, registry.known_adapters())] == [
        ("ar", True, ("hidden_states",)),  # causal_lm
        ("ar", True, ("hidden_states",)),  # embeds_lm
        ("ar", False, ("hidden_states",)),  # talker: codec codes
        ("ar", True, ("hidden_states", "inputs_embeds")),  # thinker
        ("generation", False, ()),  # token2wav: audio
        ("generation", False, ()),  # qwen3 code2wav: audio
        ("ar", False, ()),  # qwen3 talker: codec frames (tensors["codes"], not cached rows)
        ("ar", True, ("inputs_embeds", "accept_hidden_states")),  # qwen3 thinker
    ]
    assert spec("causal_lm").requires_causal_lm and spec("embeds_lm").requires_causal_lm
    assert spec("causal_lm").model_types == ()  # any model_type
    assert spec("qwen2_5_omni_thinker").model_types == ("qwen2_5_omni", "qwen2_5_omni_thinker")
    assert spec("qwen2_5_omni_token2wav").target == (
        "stages.qwen2_5_omni.token2wav:OmniToken2WavAdapter"
    )
    assert [registry.produces_text(n) for n in ("causal_lm", "qwen2_5_omni_talker")] == [1, 0]


def test_spec_checkpoint_mismatch():
    lm = registry.get_adapter_spec("causal_lm")
    assert (
        lm.checkpoint_mismatch({"model_type": "llama", "architectures": ["LlamaForCausalLM"]})
        is None
    )
    assert lm.checkpoint_mismatch({"model_type": "llama"}) is None  # no architectures: no proof
    omni = {"model_type": "qwen2_5_omni", "architectures": ["Qwen2_5OmniForConditionalGeneration"]}
    assert "*ForCausalLM" in lm.checkpoint_mismatch(omni)
    thinker = registry.get_adapter_spec("qwen2_5_omni_thinker")
    assert thinker.checkpoint_mismatch(omni) is None
    assert thinker.checkpoint_mismatch({"model_type": "qwen2_5_omni_thinker"}) is None
    assert "'qwen2_5_omni'" in thinker.checkpoint_mismatch({"model_type": "llama"})
    assert "'qwen2_5_omni'" in thinker.checkpoint_mismatch({})


def test_spec_validates_itself():
    with pytest.raises(ValueError, match="kind must be one of 'ar', 'generation', got 'encoder'"):
        AdapterSpec("x", "m:A", kind="encoder")
    with pytest.raises(ValueError, match="'module:attr'"):
        AdapterSpec("x", "m.A")
    assert AdapterSpec("x", "m:A", emits=["a"], model_types=["llama"]).emits == ("a",)  # type: ignore[arg-type]


def test_registry_imports_declared_names_on_demand(monkeypatch):
    monkeypatch.setitem(registry.ADAPTER_SPECS, "fake", AdapterSpec("fake", "json:JSONDecoder"))
    monkeypatch.delitem(registry.ADAPTERS, "fake", raising=False)
    assert "fake" in registry.known_adapters()
    assert registry.get_adapter("fake") is json.JSONDecoder
    registry.ADAPTERS.pop("fake")


def test_registry_registration(unregister):
    unregister("test_adapter")

    @registry.register_adapter("test_adapter", kind="generation", produces_text=False, emits=())
    class Dummy:
        pass

    assert registry.get_adapter("test_adapter") is Dummy
    spec = registry.get_adapter_spec("test_adapter")
    assert spec == AdapterSpec(
        "test_adapter", f"{__name__}:{Dummy.__qualname__}", "generation", False, (), (), False
    )
    assert not registry.produces_text("test_adapter")
    registry.register_adapter("test_adapter")(Dummy)  # re-registering the same class is fine
    assert registry.get_adapter_spec("test_adapter").kind == "ar"  # ... and updates its spec
    with pytest.raises(ValueError, match="already registered"):

        @registry.register_adapter("test_adapter")
        class Other:
            pass

    assert registry.get_adapter("test_adapter") is Dummy


def test_builtin_names_are_reserved(monkeypatch):
    # Restored afterwards even if a broken registry let the registration through.
    monkeypatch.setattr(registry, "ADAPTER_SPECS", dict(registry.ADAPTER_SPECS))
    monkeypatch.setattr(registry, "ADAPTERS", dict(registry.ADAPTERS))
    builtin = registry.get_adapter_spec("causal_lm")
    with pytest.raises(ValueError, match="'causal_lm' is already registered to stages.causal_lm"):

        @registry.register_adapter("causal_lm", requires_causal_lm=True)
        class Mine:
            pass

    assert registry.get_adapter_spec("causal_lm") == builtin

    class CausalLMAdapter:  # posing as the built-in, but registered with another spec
        pass

    CausalLMAdapter.__module__ = "stages.causal_lm"
    CausalLMAdapter.__qualname__ = "CausalLMAdapter"
    with pytest.raises(ValueError, match="declared in omni/registry.py as AdapterSpec"):
        registry.register_adapter("causal_lm")(CausalLMAdapter)  # requires_causal_lm missing
    assert registry.get_adapter_spec("causal_lm") == builtin


def test_builtin_registrations_match_their_specs():
    """Importing each built-in runs its register_adapter(...), which must give the declared spec
    (it raises otherwise); every adapter class gets the hooks' defaults from StageModelBase."""
    from omni.runtime.stage_model import StageModelBase

    for name in registry.known_adapters():
        cls = registry.get_adapter(name)
        spec = registry.get_adapter_spec(name)
        assert f"{cls.__module__}:{cls.__qualname__}" == spec.target
        assert issubclass(cls, StageModelBase), name
    token2wav = registry.get_adapter("qwen2_5_omni_token2wav")
    assert token2wav.sample_rate == 24000 and callable(token2wav.generate)


def test_registry_is_torch_free():
    code = (
        "import sys; from omni import registry;"
        " specs = [registry.get_adapter_spec(n) for n in registry.known_adapters()];"
        " assert registry.produces_text('qwen2_5_omni_thinker');"
        " loaded = sorted(m for m in sys.modules if m == 'torch' or m.startswith('stages'));"
        " assert not loaded, loaded"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)
