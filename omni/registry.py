"""Name -> object registries for stage model adapters and stage-to-stage input processors.

Torch-free on purpose: `omni validate` checks the names in a stage config, and whether each
stage's adapter fits its `kind` and its checkpoint, without loading any model code. Every adapter
has one `AdapterSpec` (the built-ins in `_BUILTIN_ADAPTERS` below, user adapters from
`register_adapter`); it names the adapter class as a "module:attr" string, so knowing an adapter
costs nothing and `get_adapter` imports its module only when a stage actually loads the model.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")

ADAPTER_KINDS = ("ar", "generation")
"""Stage kinds: ar (StageEngine: KV cache, sampling) or generation (GenerationEngine)."""


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
        module, _, attr = self.target.partition(":")
        if not (module and attr):
            raise ValueError(
                f"adapter {self.name!r}: target must be 'module:attr', got {self.target!r}"
            )
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


def _qwen3(part: str, cls: str, kind: str = "ar", emits: tuple[str, ...] = ()) -> AdapterSpec:
    """A Qwen3-Omni stage (stages/qwen3_omni_moe/<part>.py); only the thinker's ids are text."""
    target = f"stages.qwen3_omni_moe.{part}:{cls}"
    return AdapterSpec(f"qwen3_omni_moe_{part}", target, kind, part == "thinker", emits, (_Q3,))


_Q3 = "qwen3_omni_moe"
# Built-ins live in stages/*.py, which import torch; their specs are declared here so that config
# validation knows them before (and without) importing them. Each module's `register_adapter` call
# must give the same spec (checked when it is imported).
_BUILTIN_ADAPTERS: dict[str, AdapterSpec] = {
    spec.name: spec
    for spec in (
        AdapterSpec("causal_lm", "stages.causal_lm:CausalLMAdapter", requires_causal_lm=True),
        AdapterSpec("embeds_lm", "stages.two_stage:EmbedsLMAdapter", requires_causal_lm=True),
        AdapterSpec(
            "qwen2_5_omni_thinker",
            "stages.qwen2_5_omni.thinker:OmniThinkerAdapter",
            emits=("hidden_states", "inputs_embeds"),
            model_types=("qwen2_5_omni", "qwen2_5_omni_thinker"),
        ),
        AdapterSpec(
            "qwen2_5_omni_talker",
            "stages.qwen2_5_omni.talker:OmniTalkerAdapter",
            produces_text=False,  # codec codes
            model_types=("qwen2_5_omni",),
        ),
        AdapterSpec(
            "qwen2_5_omni_token2wav",
            "stages.qwen2_5_omni.token2wav:OmniToken2WavAdapter",
            kind="generation",
            produces_text=False,
            emits=(),  # a waveform (StageResult.audio), no per-token tensors
            model_types=("qwen2_5_omni",),
        ),
        _qwen3(
            "thinker", "Qwen3OmniThinkerAdapter", emits=("inputs_embeds", "accept_hidden_states")
        ),
        _qwen3("talker", "Qwen3OmniTalkerAdapter"),  # tokens: layer-0 codes; tensors["codes"]
        _qwen3("code2wav", "Qwen3OmniCode2WavAdapter", kind="generation"),
    )
}

ADAPTER_SPECS: dict[str, AdapterSpec] = dict(_BUILTIN_ADAPTERS)
"""Every known adapter's spec: the built-ins plus those registered with `register_adapter`."""
ADAPTERS: dict[str, object] = {}
"""Adapter classes imported or registered so far."""
INPUT_PROCESSORS: dict[str, Callable[..., Any]] = {}
"""Registered input processors (an upstream stage's output -> the next stage's input)."""


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


# Torch-free, like the adapter specs: the driver decides when to start a streaming consumer.
EDGE_STREAMING: dict[str, EdgeStreaming] = {
    "thinker_to_talker": EdgeStreaming(
        2, True, "stages.qwen2_5_omni.input_processors:thinker_delta"
    ),
    "thinker_to_talker_unmasked": EdgeStreaming(
        2, True, "stages.qwen2_5_omni.input_processors:thinker_delta"
    ),
    "talker_to_token2wav": EdgeStreaming(
        1, False, "stages.qwen2_5_omni.input_processors:talker_delta"
    ),
}
"""Input processors that can stream, by name (see EdgeStreaming)."""


def get_edge_streaming(processor: str | None) -> EdgeStreaming | None:
    """How input processor `processor` streams, or None if it cannot."""
    return None if processor is None else EDGE_STREAMING.get(processor)


def get_delta_processor(processor: str) -> Callable[..., Any]:
    """The delta function of a streaming input processor (imported on first use)."""
    spec = EDGE_STREAMING.get(processor)
    if spec is None:
        raise ValueError(f"input processor {processor!r} cannot stream (no EdgeStreaming)")
    return _import(spec.delta)


_LAZY_INPUT_PROCESSORS: dict[str, str] = {
    "hidden_to_embeds": "stages.two_stage:hidden_to_embeds",
    "thinker_to_talker": "stages.qwen2_5_omni.input_processors:thinker_to_talker",
    "thinker_to_talker_unmasked": "stages.qwen2_5_omni.input_processors:thinker_to_talker_unmasked",
    "talker_to_token2wav": "stages.qwen2_5_omni.input_processors:talker_to_token2wav",
    "qwen3_thinker_to_talker": "stages.qwen3_omni_moe.input_processors:thinker_to_talker",
    "qwen3_talker_to_code2wav": "stages.qwen3_omni_moe.input_processors:talker_to_code2wav",
}


# Root-stage prompt processors by adapter name (user prompt -> PromptInput); "module:attr".
_LAZY_PROMPT_PROCESSORS: dict[str, str] = {
    "causal_lm": "omni.entrypoints.prompt_processor:PromptProcessor",
    "qwen2_5_omni_thinker": "stages.qwen2_5_omni.prompt_processor:OmniPromptProcessor",
    "qwen3_omni_moe_thinker": "stages.qwen3_omni_moe.prompt_processor:Qwen3OmniPromptProcessor",
}
_DEFAULT_PROMPT_PROCESSOR = "omni.entrypoints.prompt_processor:PromptProcessor"


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
    """Decorator: register a function under `name` for stage configs' `input_processor`."""

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
    with its AdapterSpec (the keyword arguments; see AdapterSpec's fields). Config validation
    checks stages against the spec, so register before loading the config."""

    def decorate(cls: T) -> T:
        target = f"{getattr(cls, '__module__', '?')}:{getattr(cls, '__qualname__', repr(cls))}"
        spec = AdapterSpec(
            name, target, kind, produces_text, emits, model_types, requires_causal_lm
        )
        old = ADAPTER_SPECS.get(name)
        if old is not None and old.target != spec.target:
            raise ValueError(f"adapter {name!r} is already registered to {old.target}")
        builtin = _BUILTIN_ADAPTERS.get(name)
        if builtin is not None and spec != builtin:
            raise ValueError(
                f"adapter {name!r} is registered as {spec} but declared in omni/registry.py as "
                f"{builtin}; make them equal"
            )
        _register(ADAPTERS, "adapter", name, cls)
        ADAPTER_SPECS[name] = spec
        return cls

    return decorate


def _import(target: str) -> Any:
    module_name, _, attr = target.partition(":")
    return getattr(importlib.import_module(module_name), attr)


def get_input_processor(name: str) -> Callable[..., Any]:
    """The input processor registered as `name` (imported on first use)."""
    if name not in INPUT_PROCESSORS:
        if name not in _LAZY_INPUT_PROCESSORS:
            known = ", ".join(known_input_processors()) or "none"
            raise ValueError(f"unknown input processor {name!r}; known: {known}")
        fn = _import(_LAZY_INPUT_PROCESSORS[name])
        # Importing the module normally registers the name; fall back to the declared attribute.
        INPUT_PROCESSORS.setdefault(name, fn)
    return INPUT_PROCESSORS[name]


def get_adapter(name: str) -> Any:
    """The adapter class registered as `name` (its module imported on first use)."""
    if name not in ADAPTERS:
        cls = _import(get_adapter_spec(name).target)
        ADAPTERS.setdefault(name, cls)  # importing the module normally registered it already
    return ADAPTERS[name]


def get_prompt_processor(adapter_name: str) -> Any:
    """The prompt processor class for a root stage's adapter: call it as ``cls(model_dir)``, then
    ``processor(request_id, prompt) -> PromptInput``. Adapters without an entry take text only
    (omni.entrypoints.prompt_processor.PromptProcessor)."""
    return _import(_LAZY_PROMPT_PROCESSORS.get(adapter_name, _DEFAULT_PROMPT_PROCESSOR))


def known_input_processors() -> list[str]:
    """All input processor names, registered or declared, without importing anything."""
    return sorted(set(INPUT_PROCESSORS) | set(_LAZY_INPUT_PROCESSORS))


def known_adapters() -> list[str]:
    """All adapter names, built-in or registered, without importing anything."""
    return sorted(ADAPTER_SPECS)
