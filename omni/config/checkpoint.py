"""A stage's checkpoint against its adapter, before any model code loads: the checkpoint's
config.json, the model family that claims it (and that family's stage config), and whether the
stage's adapter can load it (AdapterSpec.checkpoint_mismatch), with a hint naming what would fit.
Torch-free, like all of omni.config.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from omni.config.validate import config_error
from omni.registry import family_dir, family_for_model_type, get_adapter_spec, known_adapters


def read_model_config(model_dir: str, path: str) -> dict[str, Any]:
    """The checkpoint's config.json; ConfigError naming `path` when it is missing or unreadable."""
    if not os.path.isdir(model_dir):
        raise config_error(path, f"no such checkpoint directory {model_dir!r}")
    config_json = os.path.join(model_dir, "config.json")
    try:
        with open(config_json, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise config_error(path, f"{model_dir!r} has no config.json (no HF checkpoint)") from None
    except (OSError, ValueError) as e:
        raise config_error(path, f"cannot read {config_json!r}: {e}") from None
    if not isinstance(data, dict):
        raise config_error(path, f"{config_json!r} is not a JSON object")
    return data


def family_stage_config(model_type: object, config_dir: str) -> str | None:
    """The stage config file of the model family that claims checkpoints of `model_type`
    (ModelFamily.stage_config): `<stage_config>.yaml` in the family's package, else in
    `config_dir` (omni's stage_configs/). None when no family claims it or it names none;
    ConfigError when the file it names is in neither place."""
    family = family_for_model_type(model_type)
    if family is None or family.stage_config is None:
        return None
    name = f"{family.stage_config}.yaml"
    places = [os.path.join(family_dir(family), name), os.path.join(config_dir, name)]
    found = next((p for p in places if os.path.isfile(p)), None)
    if found is None:
        raise config_error(
            "model",
            f"model family {family.name!r} claims model_type {model_type!r} but its stage "
            f"config {name} is in neither {places[0]} nor {places[1]}",
        )
    return found


def check_checkpoint(stage: Any, model_config: Mapping[str, Any], config_dir: str) -> None:
    """ConfigError unless `stage`'s adapter accepts the checkpoint whose config.json is
    `model_config` (AdapterSpec.model_types, requires_causal_lm). The hint names the stage config
    of the family that claims the checkpoint and adapters of the same kind that fit."""
    spec = get_adapter_spec(stage.adapter)
    reason = spec.checkpoint_mismatch(model_config)
    if reason is None:
        return
    model_type = model_config.get("model_type")
    about = f"model_type {model_type!r}"
    architectures = model_config.get("architectures")
    if architectures:
        about += f", architectures {architectures!r}"
    hints = []
    family = family_stage_config(model_type, config_dir)
    if family is not None:
        inside = os.path.dirname(family) == os.path.normpath(config_dir)
        hints.append(f"stage_configs/{os.path.basename(family)}" if inside else family)
    # Adapters of the same kind that fit; best: made for this model_type, same tokens (text or not).
    rank = {
        s.name: (model_type not in s.model_types, s.produces_text != spec.produces_text)
        for s in map(get_adapter_spec, known_adapters())
        if s.kind == spec.kind and s.checkpoint_mismatch(model_config) is None
    }
    if rank:
        best = min(rank.values())
        hints.append("adapter " + " or ".join(n for n, r in rank.items() if r == best))
    hint = f"; use {' or '.join(hints)}" if hints else ""
    raise config_error(
        f"stages.{stage.name}.adapter",
        f"adapter {stage.adapter!r} cannot load {stage.model!r} ({about}): {reason}{hint}",
    )
