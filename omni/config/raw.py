"""Raw stage-config loading for omni/config/load.py: YAML or dict, ${NAME} variables, model paths
relative to the YAML file, and overrides (dotted keys, nested dicts or CLI strings), merged into one
plain dict before any dataclass is built. Torch-free.
"""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from omni.config.validate import ConfigError, config_error, stage_path, suggest

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def load_raw(source: Any, overrides: Any, variables: Mapping[str, str]) -> dict[str, Any]:
    """load_config's source as plain data: variables substituted, overrides merged, models
    absolute."""
    if isinstance(source, Mapping):
        raw: Any = copy.deepcopy(dict(source))
    else:
        path = os.fspath(source)
        try:
            with open(path, encoding="utf-8") as f:
                raw = yaml.safe_load(f)
        except OSError as e:
            raise ConfigError(f"cannot read config file {path!r}: {e.strerror}") from None
        except yaml.YAMLError as e:
            raise ConfigError(f"{path}: invalid YAML: {e}") from None
        # Literal relative paths in a file belong to the file; ${MODEL}/x gets its base from
        # the variable, which (like dict sources and overrides) is relative to the cwd.
        _anchor_models(raw, os.path.dirname(os.path.abspath(path)), skip_variables=True)
    if not isinstance(raw, dict):
        raise ConfigError(f"a stage config must be a mapping with runtime and stages, got {raw!r}")
    raw = _substitute(raw, variables, "")
    for key, value in _parse_overrides(overrides):
        _merge(raw, key, _substitute(value, variables, key))
    _anchor_models(raw, os.getcwd())
    return raw


def _substitute(data: Any, variables: Mapping[str, str], path: str) -> Any:
    """${NAME} replaced in every string (there is no escape: no config value needs a `${`)."""
    if isinstance(data, str):

        def replace(m: re.Match[str]) -> str:
            if m[1] not in variables:
                known = ", ".join(sorted(variables)) or "none"
                raise config_error(
                    path, f"undefined variable ${{{m[1]}}} in {data!r}; defined: {known}"
                )
            value = variables[m[1]]
            return os.fspath(value) if isinstance(value, os.PathLike) else str(value)

        return _VAR.sub(replace, data)
    if isinstance(data, Mapping):
        return {k: _substitute(v, variables, f"{path}.{k}".lstrip(".")) for k, v in data.items()}
    if isinstance(data, list):
        paths = [
            stage_path(i, v) if path == "stages" else f"{path}[{i}]" for i, v in enumerate(data)
        ]
        return [_substitute(v, variables, p) for p, v in zip(paths, data, strict=True)]
    return data


def _anchor_models(raw: Any, base_dir: str, *, skip_variables: bool = False) -> None:
    stages = raw.get("stages") if isinstance(raw, dict) else None
    for stage in stages if isinstance(stages, list) else ():
        model = stage.get("model") if isinstance(stage, dict) else None
        if isinstance(model, str) and model and not (skip_variables and model.startswith("${")):
            stage["model"] = os.path.normpath(os.path.join(base_dir, os.path.expanduser(model)))


def _parse_overrides(
    overrides: Mapping[str, object] | Sequence[str] | None,
) -> list[tuple[str, Any]]:
    if isinstance(overrides, Mapping):
        return [(str(k), v) for k, v in overrides.items()]
    pairs = []
    for item in [overrides] if isinstance(overrides, str) else overrides or ():
        if not isinstance(item, str) or "=" not in item:
            example = "stages.thinker.engine.num_blocks=512"
            raise ConfigError(f"override {item!r}: expected KEY=VALUE, e.g. {example}")
        key, _, text = item.partition("=")
        try:
            pairs.append((key.strip(), yaml.safe_load(text)))
        except yaml.YAMLError as e:
            raise ConfigError(f"override {item!r}: the value is not YAML: {e}") from None
    return pairs


def _merge(raw: dict[str, Any], key: str, value: Any) -> None:
    """Set dotted `key`: mappings merge into what is there, anything else replaces it.

    Under `stages` a path component is a stage name (or a list index).
    """
    if isinstance(value, Mapping):
        for sub_key, sub_value in value.items():
            _merge(raw, f"{key}.{sub_key}", sub_value)
        return
    parts = key.split(".")
    node: Any = raw
    for depth, part in enumerate(parts):
        if not part:
            raise ConfigError(f"override {key!r}: empty key component")
        index: str | int = part  # a list (the stages) is indexed by stage name or position
        if isinstance(node, list):
            names = [s.get("name") if isinstance(s, dict) else None for s in node]
            if part in names:
                index = names.index(part)
            elif part.isdigit() and int(part) < len(node):
                index = int(part)
            else:
                known = [str(name) for name in names if name is not None]
                raise ConfigError(
                    f"override {key!r}: no stage named {part!r}{suggest(part, known)}"
                )
        elif not isinstance(node, dict):
            raise ConfigError(f"override {key!r}: {'.'.join(parts[:depth])} is not a mapping")
        elif depth < len(parts) - 1 and node.get(part) is None:
            node[part] = {}
        if depth == len(parts) - 1:
            node[index] = value
        node = node[index]
