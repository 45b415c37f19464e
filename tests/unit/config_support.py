"""Helpers shared by the config tests: fake checkpoints and stage dicts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from omni.config import load_config

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "stage_configs"


def make_model(path: Path, config: dict | None = None) -> str:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config or {"model_type": "llama"}))
    return str(path)


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
