"""A model family's manifest: everything omni knows about a family, declared once in its package.

Each family has a manifest module, `family.py` in its package under stages/ (`<name>_family.py`
beside a one-module family such as stages/causal_lm.py), that binds `FAMILY = ModelFamily(...)`:
its stage model adapters with their specs, the edges between its
stages (input processors and how they stream), the prompt processor of its root stage, its
audio sample rate, and the stage config `Omni(model=DIR)` runs for the checkpoints it claims.
omni.registry lists the manifest modules by name and reads each with `read_manifest`, without
importing it or its package: a manifest imports only this module, so knowing every family
costs no torch and no model code. Every class a manifest names is a "module:attr" string,
imported only when a stage loads it. docs/adding_a_model_family.md walks through one.

Torch-free and standard-library only (omni/ layer 0).
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

ADAPTER_KINDS = ("ar", "generation")
"""Stage kinds: ar (StageEngine: KV cache, sampling) or generation (GenerationEngine)."""


def check_target(owner: str, target: str) -> None:
    """ValueError unless `target` is a "module:attr" string."""
    module, _, attr = target.partition(":") if isinstance(target, str) else ("", "", "")
    if not (module and attr):
        raise ValueError(f"{owner}: target must be 'module:attr', got {target!r}")


@dataclass(frozen=True)
class AdapterSpec:
    """What omni knows about a stage model adapter without importing it."""

    name: str
    """The name stage configs give as `adapter`."""
    target: str
    """The adapter class as "module:attr", imported only when a stage loads its model."""
    kind: str = "ar"
    """The stage kind it runs in: "ar" (autoregressive, StageEngine) or "generation" (one-shot)."""
    produces_text: bool = True
    """Its generated token ids are text in the checkpoint's tokenizer (results carry `text`)."""
    emits: tuple[str, ...] = ("hidden_states",)
    """Per-token tensors it puts in StageResult.tensors (output-cache names); () for none."""
    model_types: tuple[str, ...] = ()
    """Checkpoint config.json `model_type`s it accepts; empty means any."""
    requires_causal_lm: bool = False
    """The checkpoint's config.json `architectures`, when listed, must name a *ForCausalLM."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "emits", tuple(self.emits))
        object.__setattr__(self, "model_types", tuple(self.model_types))
        check_target(f"adapter {self.name!r}", self.target)
        if self.kind not in ADAPTER_KINDS:
            kinds = ", ".join(repr(k) for k in ADAPTER_KINDS)
            raise ValueError(
                f"adapter {self.name!r}: kind must be one of {kinds}, got {self.kind!r}"
            )
        for name in (*self.emits, *self.model_types):
            if not isinstance(name, str) or not name:
                raise ValueError(
                    f"adapter {self.name!r}: emits and model_types hold names, got {name!r}"
                )

    def checkpoint_mismatch(self, model_config: Mapping[str, Any]) -> str | None:
        """Why this adapter cannot load a checkpoint with this config.json, or None if it can."""
        model_type = model_config.get("model_type")
        if self.model_types and model_type not in self.model_types:
            accepted = " or ".join(repr(t) for t in self.model_types)
            return f"it loads model_type {accepted} only"
        # No `architectures` (a hand-written config.json) proves nothing: only listed heads that
        # are all something else (e.g. *ForConditionalGeneration) are refused.
        architectures = model_config.get("architectures")
        listed = architectures if isinstance(architectures, list) else []
        causal = any(isinstance(a, str) and a.endswith("ForCausalLM") for a in listed)
        if self.requires_causal_lm and listed and not causal:
            return "it loads *ForCausalLM checkpoints only"
        return None


@dataclass(frozen=True)
class EdgeStreaming:
    """How an input processor lets its stage start a streaming request before the upstream stage
    has finished it (stage config `stream.enabled`)."""

    min_upstream_tokens: int
    """Upstream tokens generated before the processor can build the stage's first input."""
    needs_rows: bool
    """Whether later input needs the upstream's per-token output rows (StageUpdate.tensors)."""
    delta: str
    """"module:attr" of fn(piece: StageResult) -> InputDelta, run where the stage runs: turns the
    upstream's next piece (new tokens and rows; finish_reason set on the last) into input."""
    held_back: int = 0
    """The upstream's latest tokens a piece leaves out until more follow, and that the stage
    never takes from the finished upstream (its input processor drops them too): e.g. a talker's
    last frame, which its vocoder never decodes. min_upstream_tokens counts them."""

    def __post_init__(self) -> None:
        if not 0 <= self.held_back < self.min_upstream_tokens:
            raise ValueError(
                f"EdgeStreaming: held_back must be in [0, min_upstream_tokens), got "
                f"{self.held_back} with min_upstream_tokens {self.min_upstream_tokens}"
            )


@dataclass(frozen=True)
class EdgeSpec:
    """An input processor: what a stage with `inputs` runs on its upstream stages' results."""

    name: str
    """The name stage configs give as `input_processor`."""
    target: str
    """"module:attr" of fn(upstream: dict[str, StageResult], prompt: PromptInput) -> StageInput."""
    stream: EdgeStreaming | None = None
    """How it streams (stage config `stream.enabled`); None: it needs the finished upstream."""

    def __post_init__(self) -> None:
        check_target(f"input processor {self.name!r}", self.target)
        if self.stream is not None:
            check_target(f"input processor {self.name!r}: stream.delta", self.stream.delta)


@dataclass(frozen=True)
class ModelFamily:
    """One model family's manifest (the `FAMILY` of its manifest module)."""

    name: str
    """The family's name, e.g. "qwen2_5_omni"; unique among the families omni knows."""
    adapters: tuple[AdapterSpec, ...] = ()
    """Its stage model adapters; their names are unique among all families."""
    edges: tuple[EdgeSpec, ...] = ()
    """Its input processors (stage-to-stage edges); their names are unique among all families."""
    prompt_processor: str | None = None
    """"module:attr" of the PromptProcessor subclass (omni.engine.prompt_processor) a root stage
    running one of its adapters uses: prompt parsing, chat framing, the speech prompt, voices.
    None: the text-only PromptProcessor."""
    model_types: tuple[str, ...] = ()
    """The checkpoint config.json `model_type`s whose `Omni(model=DIR)` runs its stage config;
    each is claimed by one family only."""
    stage_config: str | None = None
    """Its pipeline for claimed checkpoints: `<stage_config>.yaml` beside the manifest (in the
    family package), else in omni's stage_configs/ (loaded with MODEL=the checkpoint directory).
    None: no pipeline of its own (a claimed checkpoint then gets the causal-LM pipeline)."""
    sample_rate: int | None = None
    """Samples per second of the audio its pipeline returns, for a result that carries none;
    None for families without audio."""

    def __post_init__(self) -> None:
        for field in ("adapters", "edges", "model_types"):
            object.__setattr__(self, field, tuple(getattr(self, field)))
        where = f"model family {self.name!r}"
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"model family: name must be a non-empty string, got {self.name!r}")
        for field, cls in (("adapters", AdapterSpec), ("edges", EdgeSpec)):
            items = getattr(self, field)
            wrong = [x for x in items if not isinstance(x, cls)]
            if wrong:
                raise ValueError(f"{where}: {field} holds {cls.__name__}s, got {wrong[0]!r}")
            names = [x.name for x in items]
            repeated = sorted({n for n in names if names.count(n) > 1})
            if repeated:
                raise ValueError(f"{where}: {field} repeats {repeated}")
        if self.prompt_processor is not None:
            check_target(f"{where}: prompt_processor", self.prompt_processor)
        for model_type in self.model_types:
            if not isinstance(model_type, str) or not model_type:
                raise ValueError(f"{where}: model_types holds names, got {model_type!r}")
        if self.stage_config is not None and (
            not isinstance(self.stage_config, str) or not self.stage_config
        ):
            raise ValueError(f"{where}: stage_config must be a name, got {self.stage_config!r}")
        if self.sample_rate is not None and (
            isinstance(self.sample_rate, bool)
            or not isinstance(self.sample_rate, int)
            or self.sample_rate <= 0
        ):
            raise ValueError(
                f"{where}: sample_rate must be a positive int, got {self.sample_rate!r}"
            )


def manifest_path(module: str) -> str:
    """The file of manifest module `module` ("stages.qwen2_5_omni.family"), found as `import`
    would find it (sys.path, and the finders an editable install adds to sys.meta_path) without
    importing it or the packages above it (their modules may import torch)."""
    *packages, name = module.split(".")
    locations: list[str] | None = None
    for depth, part in enumerate(packages, start=1):
        spec = _find_spec(".".join(packages[:depth]), locations)
        if spec is None or not spec.submodule_search_locations:
            raise ValueError(f"model family {module!r}: no package {part!r} found on sys.path")
        locations = list(spec.submodule_search_locations)
    spec = _find_spec(module, locations)
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        raise ValueError(f"model family {module!r}: no module {name!r} found on sys.path")
    return spec.origin


def _find_spec(fullname: str, locations: list[str] | None) -> Any:
    """The first meta-path finder's spec of `fullname`, searched in `locations` (its parent
    package's; None: top level), without executing anything."""
    for finder in sys.meta_path:
        find_spec = getattr(finder, "find_spec", None)
        spec = find_spec(fullname, locations) if find_spec is not None else None
        if spec is not None:
            return spec
    return None


def read_manifest(module: str) -> ModelFamily:
    """The `FAMILY` bound by manifest module `module`, executed on its own: neither it nor its
    packages are imported, and nothing enters sys.modules."""
    path = manifest_path(module)
    spec = importlib.util.spec_from_file_location(module, path)
    assert spec is not None and spec.loader is not None  # a .py file always has a loader
    code = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(code)
    family = getattr(code, "FAMILY", None)
    if not isinstance(family, ModelFamily):
        raise ValueError(f"model family {module!r}: {path} must bind FAMILY = ModelFamily(...)")
    return family
