"""Loading a pipeline config: from YAML or a dict (`load_config`), or from a checkpoint directory
alone (`config_for_model`), with the defaults that depend on the checkpoint or on the stage graph
made concrete (max_model_len, per-token outputs). Torch-free, like all of omni.config.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Any

from omni.config.checkpoint import check_checkpoint, family_stage_config, read_model_config
from omni.config.raw import load_raw
from omni.config.schema import STAGE_CONFIG_DIR, OmniConfig, RuntimeConfig, StageConfig
from omni.config.validate import ConfigError, build, config_error, stage_path, suggest
from omni.registry import get_adapter_spec


def load_config(
    source: str | os.PathLike[str] | Mapping[str, Any],
    overrides: Mapping[str, object] | Sequence[str] | None = None,
    variables: Mapping[str, str] | None = None,
    *,
    check_models: bool = True,
) -> OmniConfig:
    """An OmniConfig from a YAML file or an equivalent dict, fully validated.

    overrides: {"stages.thinker.engine.num_blocks": 512}, nested dicts ({"runtime": {...}},
    merged) or CLI strings ["stages.thinker.engine.num_blocks=512"] (values parsed as YAML);
    stages are addressed by name. variables: for ${NAME} in string values (undefined: error).
    check_models=False skips the checkpoint checks (e.g. validating elsewhere): with them, each
    stage's config.json must exist and fit its adapter's spec (model_type, architectures), all
    before any model code is imported.
    """
    raw = load_raw(source, overrides, dict(variables or {}))
    for key in raw:
        if key not in ("runtime", "stages"):
            hint = suggest(str(key), ["runtime", "stages"])
            raise ConfigError(f"unknown top-level key {key!r}{hint}")
    stages = raw.get("stages")
    if not isinstance(stages, list):
        raise config_error("stages", f"must be a list of stages, got {stages!r}")
    config = OmniConfig(
        runtime=build(RuntimeConfig, raw.get("runtime"), "runtime"),
        stages=tuple(build(StageConfig, s, stage_path(i, s)) for i, s in enumerate(stages)),
    )
    model_configs: dict[str, dict[str, Any]] = {}
    if check_models:
        for stage in config.stages:
            model_config = read_model_config(stage.model, f"stages.{stage.name}.model")
            check_checkpoint(stage, model_config, STAGE_CONFIG_DIR)
            model_configs[stage.name] = model_config
    return _with_defaults(config, model_configs)


DEFAULT_MAX_MODEL_LEN = 4096


def _with_defaults(config: OmniConfig, model_configs: dict[str, dict[str, Any]]) -> OmniConfig:
    """Null engine settings that depend on the checkpoint or the stage graph, made concrete:
    max_model_len from the checkpoint, outputs from whether another stage consumes them."""
    stages = []
    for stage in config.stages:
        engine = stage.engine
        if engine.max_model_len is None:
            limit = _max_positions(model_configs.get(stage.name, {}))
            engine = dataclasses.replace(engine, max_model_len=limit or DEFAULT_MAX_MODEL_LEN)
        if engine.outputs is None:
            consumed = bool(config.consumers(stage.name))
            emits = get_adapter_spec(stage.adapter).emits if consumed else ()
            engine = dataclasses.replace(engine, outputs=tuple(emits))
        stages.append(dataclasses.replace(stage, engine=engine))
    return dataclasses.replace(config, stages=tuple(stages))


def _max_positions(model_config: Mapping[str, Any]) -> int | None:
    """max_position_embeddings of a checkpoint's config.json (for a composite model, of its
    text model: the first one found, top level first)."""
    value = model_config.get("max_position_embeddings")
    if type(value) is int and value >= 1:
        return value
    for sub_config in model_config.values():
        if isinstance(sub_config, Mapping):
            found = _max_positions(sub_config)
            if found is not None:
                return found
    return None


def config_for_model(
    model_dir: str | os.PathLike[str],
    overrides: Mapping[str, object] | Sequence[str] | None = None,
) -> OmniConfig:
    """The pipeline for a checkpoint directory: the stage config of the model family that
    claims the model_type in its config.json (omni.registry, ModelFamily.stage_config; loaded
    with variable MODEL=model_dir), else a one-stage config (stage `llm`, adapter causal_lm) for
    a plain HF causal LM, whose max_model_len is the checkpoint's max_position_embeddings."""
    model_dir = os.path.abspath(os.path.expanduser(os.fspath(model_dir)))
    model_config = read_model_config(model_dir, "model")
    family = family_stage_config(model_config.get("model_type"), STAGE_CONFIG_DIR)
    if family is not None:
        return load_config(family, overrides, {"MODEL": model_dir})
    stage: dict[str, Any] = {"name": "llm", "model": model_dir, "adapter": "causal_lm"}
    return load_config({"stages": [stage]}, overrides)
