"""The model families omni knows, and name -> object lookups for what they declare.

Torch-free on purpose: `omni validate` checks the names in a stage config, and whether each
stage's adapter fits its `kind` and its checkpoint, without loading any model code. The facts
about a model live in its family's manifest (omni/family.py: `ModelFamily`), in the family's own
package; this module holds no model facts, only the list of manifest modules (`FAMILIES`, plus
those installed packages name with an `omni.model_families` entry point). It reads every
manifest when imported and fills the tables below; an adapter, input processor or prompt processor is imported
from its "module:attr" string only when first used. `register_adapter` and
`register_input_processor` add objects defined in user code (tests, notebooks) by hand.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
from collections.abc import Callable
from typing import Any, TypeVar

from omni.family import ADAPTER_KINDS as ADAPTER_KINDS
from omni.family import AdapterSpec as AdapterSpec
from omni.family import EdgeStreaming as EdgeStreaming
from omni.family import ModelFamily, manifest_path, read_manifest

T = TypeVar("T")

FAMILIES: tuple[str, ...] = (
    "stages.causal_lm_family",
    "stages.two_stage_family",
    "stages.qwen2_5_omni.family",
    "stages.qwen3_omni_moe.family",
)
"""The manifest modules of the families in this repository: a new family adds its line here."""

ENTRY_POINT_GROUP = "omni.model_families"
"""Installed packages add a family with an entry point in this group, `name = "package.family"`
(the manifest module)."""

DEFAULT_PROMPT_PROCESSOR = "omni.engine.prompt_processor:PromptProcessor"
"""The prompt processor of a root stage whose family names none: text and token ids only."""

MODEL_FAMILIES: dict[str, ModelFamily] = {}
"""Every family's manifest by family name, in load order."""
FAMILY_MANIFESTS: dict[str, str] = {}
"""Family name -> the manifest module it was read from."""
ADAPTER_SPECS: dict[str, AdapterSpec] = {}
"""Every known adapter's spec: the families' plus those registered with `register_adapter`."""
ADAPTERS: dict[str, object] = {}
"""Adapter classes imported or registered so far."""
INPUT_PROCESSORS: dict[str, Callable[..., Any]] = {}
"""Input processors imported or registered so far (upstream stages' output -> the next input)."""
EDGE_STREAMING: dict[str, EdgeStreaming] = {}
"""Input processors that can stream, by name (see EdgeStreaming)."""

_DECLARED_ADAPTERS: dict[str, AdapterSpec] = {}  # what the manifests say, for register_adapter
_DECLARED_EDGES: dict[str, str] = {}  # input processor name -> "module:attr"
_FAMILY_OF: dict[str, str] = {}  # adapter name -> family name
_CLAIMS: dict[str, str] = {}  # checkpoint model_type -> family name


def add_family(manifest: str) -> ModelFamily:
    """Read manifest module `manifest` ("stages.qwen2_5_omni.family") and add what it declares.
    ValueError when a name it declares (family, adapter, input processor, claimed model_type) is
    taken."""
    family = read_manifest(manifest)
    where = f"model family {family.name!r} ({manifest})"
    if family.name in MODEL_FAMILIES:
        raise ValueError(f"{where}: the name is taken by {FAMILY_MANIFESTS[family.name]}")
    taken = [f"adapter {a.name!r}" for a in family.adapters if a.name in ADAPTER_SPECS] + [
        f"input processor {e.name!r}" for e in family.edges if e.name in _DECLARED_EDGES
    ]
    taken += [f"model_type {t!r} (by {_CLAIMS[t]})" for t in family.model_types if t in _CLAIMS]
    if taken:
        raise ValueError(f"{where}: already declared: {', '.join(taken)}")
    MODEL_FAMILIES[family.name] = family
    FAMILY_MANIFESTS[family.name] = manifest
    for spec in family.adapters:
        ADAPTER_SPECS[spec.name] = _DECLARED_ADAPTERS[spec.name] = spec
        _FAMILY_OF[spec.name] = family.name
    for edge in family.edges:
        _DECLARED_EDGES[edge.name] = edge.target
        if edge.stream is not None:
            EDGE_STREAMING[edge.name] = edge.stream
    _CLAIMS.update(dict.fromkeys(family.model_types, family.name))
    return family


def _installed_families() -> list[str]:
    """Manifest modules named by `omni.model_families` entry points of installed packages."""
    return sorted({ep.value for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)})


def family_of(adapter_name: str) -> ModelFamily | None:
    """The family that declares adapter `adapter_name` (None for one registered by hand)."""
    name = _FAMILY_OF.get(adapter_name)
    return None if name is None else MODEL_FAMILIES[name]


def family_for_model_type(model_type: object) -> ModelFamily | None:
    """The family that claims checkpoints of this config.json `model_type`, if any."""
    name = _CLAIMS.get(model_type) if isinstance(model_type, str) else None
    return None if name is None else MODEL_FAMILIES[name]


def family_dir(family: ModelFamily) -> str:
    """The folder of `family`'s manifest (its package)."""
    return os.path.dirname(manifest_path(FAMILY_MANIFESTS[family.name]))


def get_edge_streaming(processor: str | None) -> EdgeStreaming | None:
    """How input processor `processor` streams, or None if it cannot."""
    return None if processor is None else EDGE_STREAMING.get(processor)


def get_delta_processor(processor: str) -> Callable[..., Any]:
    """The delta function of a streaming input processor (imported on first use)."""
    spec = EDGE_STREAMING.get(processor)
    if spec is None:
        raise ValueError(f"input processor {processor!r} cannot stream (no EdgeStreaming)")
    return _import(spec.delta)


def get_adapter_spec(name: str) -> AdapterSpec:
    """The spec of adapter `name`; never imports the adapter's module."""
    spec = ADAPTER_SPECS.get(name)
    if spec is None:
        raise ValueError(
            f"unknown adapter {name!r}; known: {', '.join(known_adapters()) or 'none'}"
        )
    return spec


def produces_text(adapter_name: str) -> bool:
    """Whether the adapter's generated token ids are text (others, such as a talker's codec
    codes, get no `text`)."""
    return get_adapter_spec(adapter_name).produces_text


def _register(table: dict[str, Any], kind: str, name: str, obj: Any) -> None:
    old = table.get(name)
    # Re-importing a module (reload, pytest rewriting) registers an equal object again: allow it.
    if old is not None and old is not obj and _qualname(old) != _qualname(obj):
        raise ValueError(f"{kind} {name!r} is already registered to {_qualname(old)}")
    table[name] = obj


def _qualname(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', repr(obj))}"


def register_input_processor(name: str) -> Callable[[T], T]:
    """Decorator: register a function under `name` for stage configs' `input_processor`
    (for user code; a family declares its input processors in its manifest)."""

    def decorate(fn: T) -> T:
        _register(INPUT_PROCESSORS, "input processor", name, fn)
        return fn

    return decorate


def register_adapter(
    name: str,
    *,
    kind: str = "ar",
    produces_text: bool = True,
    emits: tuple[str, ...] = ("hidden_states",),
    model_types: tuple[str, ...] = (),
    requires_causal_lm: bool = False,
) -> Callable[[T], T]:
    """Decorator: register a stage model adapter class under `name` for stage configs' `adapter`,
    with its AdapterSpec (the keyword arguments; see AdapterSpec's fields), for user code (a
    family declares its adapters in its manifest). Config validation checks stages against the
    spec, so register before loading the config."""

    def decorate(cls: T) -> T:
        target = f"{getattr(cls, '__module__', '?')}:{getattr(cls, '__qualname__', repr(cls))}"
        spec = AdapterSpec(
            name, target, kind, produces_text, emits, model_types, requires_causal_lm
        )
        old = ADAPTER_SPECS.get(name)
        if old is not None and old.target != spec.target:
            raise ValueError(f"adapter {name!r} is already registered to {old.target}")
        declared = _DECLARED_ADAPTERS.get(name)
        if declared is not None and spec != declared:
            family = FAMILY_MANIFESTS[_FAMILY_OF[name]]
            raise ValueError(
                f"adapter {name!r} is registered as {spec} but declared in omni/registry.py as "
                f"{declared} (the manifest of family {family}); make them equal"
            )
        _register(ADAPTERS, "adapter", name, cls)
        ADAPTER_SPECS[name] = spec
        return cls

    return decorate


def _import(target: str) -> Any:
    module_name, _, attr = target.partition(":")
    return getattr(importlib.import_module(module_name), attr)


def get_input_processor(name: str) -> Callable[..., Any]:
    """The input processor registered or declared as `name` (imported on first use)."""
    if name not in INPUT_PROCESSORS:
        if name not in _DECLARED_EDGES:
            known = ", ".join(known_input_processors()) or "none"
            raise ValueError(f"unknown input processor {name!r}; known: {known}")
        INPUT_PROCESSORS.setdefault(name, _import(_DECLARED_EDGES[name]))
    return INPUT_PROCESSORS[name]


def get_adapter(name: str) -> Any:
    """The adapter class registered or declared as `name` (its module imported on first use)."""
    if name not in ADAPTERS:
        ADAPTERS.setdefault(name, _import(get_adapter_spec(name).target))
    return ADAPTERS[name]


def get_prompt_processor(adapter_name: str) -> Any:
    """The prompt processor class for a root stage's adapter: its family's, else the text-only
    omni.engine.prompt_processor.PromptProcessor. Call it as ``cls(model_dir)``, then
    ``processor(request_id, prompt) -> PromptInput``."""
    family = family_of(adapter_name)
    target = family.prompt_processor if family is not None else None
    return _import(target or DEFAULT_PROMPT_PROCESSOR)


def known_input_processors() -> list[str]:
    """All input processor names, registered or declared, without importing anything."""
    return sorted(set(INPUT_PROCESSORS) | set(_DECLARED_EDGES))


def known_adapters() -> list[str]:
    """All adapter names, declared or registered, without importing anything."""
    return sorted(ADAPTER_SPECS)


for _manifest in dict.fromkeys((*FAMILIES, *_installed_families())):
    add_family(_manifest)
