"""The torch-free name registries of stage adapters and input processors (stages/registry.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from stages import registry

REPO = Path(__file__).resolve().parents[2]


pytestmark = pytest.mark.usefixtures("join_processor")


def test_registry_lookup_is_lazy_and_lists_names():
    assert "causal_lm" in registry.known_adapters()
    assert "join" in registry.known_input_processors()
    with pytest.raises(ValueError, match="unknown adapter 'nope'; known: .*causal_lm"):
        registry.get_adapter("nope")
    with pytest.raises(ValueError, match="unknown input processor 'nope'; known: .*join"):
        registry.get_input_processor("nope")
    assert registry.get_input_processor("join")([1]) == [1]


def test_registry_imports_declared_names_on_demand(monkeypatch):
    monkeypatch.setitem(registry._LAZY_ADAPTERS, "fake", "json:JSONDecoder")
    monkeypatch.delitem(registry.ADAPTERS, "fake", raising=False)
    assert "fake" in registry.known_adapters()
    assert registry.get_adapter("fake") is json.JSONDecoder
    registry.ADAPTERS.pop("fake")


def test_registry_registration():
    @registry.register_adapter("test_adapter")
    class Dummy:
        pass

    try:
        assert registry.get_adapter("test_adapter") is Dummy
        registry.register_adapter("test_adapter")(Dummy)  # re-registering the same class is fine
        with pytest.raises(ValueError, match="already registered"):

            @registry.register_adapter("test_adapter")
            class Other:
                pass
    finally:
        registry.ADAPTERS.pop("test_adapter", None)


def test_registry_is_torch_free():
    code = "import stages, sys; stages.known_adapters(); assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)
