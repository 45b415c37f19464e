"""Name -> object registries for stage model adapters and stage-to-stage input processors.

Torch-free on purpose: `omni validate` checks the names in a stage config without loading any model
code. Built-in names are declared lazily as "module:attr" strings, so knowing that a name exists
costs nothing and `get_*` imports the module only when the object is actually needed.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

INPUT_PROCESSORS: dict[str, Callable[..., Any]] = {}
"""Registered input processors (an upstream stage's output -> the next stage's input)."""
ADAPTERS: dict[str, object] = {}
"""Registered stage model adapter classes."""

# Built-ins live in stages/*.py, which import torch; they are listed here so that config
# validation knows their names before (and without) importing them.
_LAZY_ADAPTERS: dict[str, str] = {
    "causal_lm": "stages.causal_lm:CausalLMAdapter",
    "embeds_lm": "stages.two_stage:EmbedsLMAdapter",
    "qwen2_5_omni_thinker": "stages.qwen2_5_omni.thinker:OmniThinkerAdapter",
    "qwen2_5_omni_talker": "stages.qwen2_5_omni.talker:OmniTalkerAdapter",
    "qwen2_5_omni_token2wav": "stages.qwen2_5_omni.token2wav:OmniToken2WavAdapter",
}
_LAZY_INPUT_PROCESSORS: dict[str, str] = {
    "hidden_to_embeds": "stages.two_stage:hidden_to_embeds",
    "thinker_to_talker": "stages.qwen2_5_omni.processors:thinker_to_talker",
    "thinker_to_talker_unmasked": "stages.qwen2_5_omni.processors:thinker_to_talker_unmasked",
    "talker_to_token2wav": "stages.qwen2_5_omni.processors:talker_to_token2wav",
}


# Root-stage prompt processors by adapter name (user prompt -> PromptInput); "module:attr".
_LAZY_PROMPT_PROCESSORS: dict[str, str] = {
    "causal_lm": "omni.inputs:PromptProcessor",
    "qwen2_5_omni_thinker": "stages.qwen2_5_omni.processor:OmniPromptProcessor",
}
_DEFAULT_PROMPT_PROCESSOR = "omni.inputs:PromptProcessor"

# Adapters whose generated token ids are text in their checkpoint's tokenizer (others, such as a
# talker's codec codes, get no `text`).
_TEXT_ADAPTERS = {"causal_lm", "embeds_lm", "qwen2_5_omni_thinker"}


def produces_text(adapter_name: str) -> bool:
    return adapter_name in _TEXT_ADAPTERS


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


def register_adapter(name: str) -> Callable[[T], T]:
    """Decorator: register a stage model adapter class under `name` for stage configs' `adapter`."""

    def decorate(cls: T) -> T:
        _register(ADAPTERS, "adapter", name, cls)
        return cls

    return decorate


def _lookup(table: dict[str, Any], lazy: dict[str, str], kind: str, name: str) -> Any:
    if name in table:
        return table[name]
    if name not in lazy:
        known = ", ".join(sorted(set(table) | set(lazy))) or "none"
        raise ValueError(f"unknown {kind} {name!r}; known: {known}")
    module_name, _, attr = lazy[name].partition(":")
    module = importlib.import_module(module_name)
    # Importing the module normally registers the name; fall back to the declared attribute.
    if name not in table:
        table[name] = getattr(module, attr)
    return table[name]


def get_input_processor(name: str) -> Callable[..., Any]:
    """The input processor registered as `name` (imported on first use)."""
    return _lookup(INPUT_PROCESSORS, _LAZY_INPUT_PROCESSORS, "input processor", name)


def get_adapter(name: str) -> Any:
    """The adapter class registered as `name` (imported on first use)."""
    return _lookup(ADAPTERS, _LAZY_ADAPTERS, "adapter", name)


def get_prompt_processor(adapter_name: str) -> Any:
    """The prompt processor class for a root stage's adapter: call it as ``cls(model_dir)``, then
    ``processor(request_id, prompt) -> PromptInput``. Adapters without an entry take text only
    (omni.inputs.PromptProcessor)."""
    module_name, _, attr = _LAZY_PROMPT_PROCESSORS.get(
        adapter_name, _DEFAULT_PROMPT_PROCESSOR
    ).partition(":")
    return getattr(importlib.import_module(module_name), attr)


def known_input_processors() -> list[str]:
    """All input processor names, registered or declared, without importing anything."""
    return sorted(set(INPUT_PROCESSORS) | set(_LAZY_INPUT_PROCESSORS))


def known_adapters() -> list[str]:
    """All adapter names, registered or declared, without importing anything."""
    return sorted(set(ADAPTERS) | set(_LAZY_ADAPTERS))
