"""User prompts -> normalized PromptInput for the root stage(s), validated before any work."""

from __future__ import annotations

import operator
import os
import re
from typing import Any

from omni.messages import PromptInput

_PROMPT_KEYS = ("prompt", "prompt_token_ids", "images", "audio", "cache_salt")


def _checked_token_ids(request_id: str, token_ids: Any) -> list[int]:
    """Plain ints (numpy integers accepted); anything else is a ValueError naming the entry."""
    checked = []
    for index, token_id in enumerate(token_ids):
        try:
            if isinstance(token_id, bool):
                raise TypeError
            value = operator.index(token_id)
        except TypeError:
            value = -1
        if value < 0:
            raise ValueError(
                f"prompt {request_id!r}: prompt_token_ids[{index}] = {token_id!r} is not a "
                "non-negative integer"
            )
        checked.append(value)
    return checked


# What transformers reads a tokenizer from (tokenizer.json, tokenizer_config.json, tokenizer.model,
# vocab.json + merges.txt, vocab.txt, spiece.model, *.tiktoken, tekken.json, ...).
_TOKENIZER_FILE = re.compile(
    r"(tokenizer.*|vocab.*|merges\.txt|special_tokens_map\.json|added_tokens\.json"
    r"|.*\.tiktoken|tekken\.json|spiece\.model|sentencepiece.*\.model|spm.*\.model)",
    re.IGNORECASE,
)


def has_tokenizer_files(model_dir: str) -> bool:
    """Whether a checkpoint directory holds any tokenizer file (True for a non-directory: a hub
    name is left to transformers)."""
    if not os.path.isdir(model_dir):
        return True
    return any(_TOKENIZER_FILE.fullmatch(name) for name in os.listdir(model_dir))


def load_tokenizer(model_dir: str) -> Any | None:
    """The checkpoint's tokenizer, or None when the directory has no tokenizer files.

    Checked before loading: transformers 5 does not fail on such a directory but builds an empty
    tokenizer that encodes every text to [] and decodes every token to ''. A directory that has
    tokenizer files but cannot be loaded still raises transformers' error.
    """
    if not has_tokenizer_files(model_dir):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


class PromptProcessor:
    """Tokenizes text prompts with the root stage's tokenizer. Multimodal families subclass it."""

    def __init__(self, model_dir: str) -> None:
        self.model_dir = model_dir
        self.tokenizer: Any = load_tokenizer(model_dir)
        """The root stage's tokenizer; None for a checkpoint without tokenizer files, which
        serves prompt_token_ids only (vLLM's skip_tokenizer_init)."""
        self.voices: list[str] = []
        """Speakers a prompt may pick with its "speaker" key (none for text-only pipelines)."""

    def __call__(self, request_id: str, prompt: Any) -> PromptInput:
        if isinstance(prompt, str):
            prompt = {"prompt": prompt}
        elif isinstance(prompt, list | tuple):
            prompt = {"prompt_token_ids": list(prompt)}
        if not isinstance(prompt, dict):
            raise ValueError(
                f"prompt {request_id!r}: expected str, list of token ids or dict, got {type(prompt).__name__}"
            )
        unknown = sorted(set(prompt) - set(_PROMPT_KEYS))
        if unknown:
            raise ValueError(
                f"prompt {request_id!r}: unknown key(s) {unknown}; valid: {list(_PROMPT_KEYS)}"
            )
        if ("prompt" in prompt) == ("prompt_token_ids" in prompt):
            raise ValueError(
                f"prompt {request_id!r}: give exactly one of 'prompt' and 'prompt_token_ids'"
            )
        if prompt.get("images") or prompt.get("audio"):
            raise ValueError(
                f"prompt {request_id!r}: this pipeline's root stage takes text only, "
                "but the prompt has images or audio"
            )
        text = prompt.get("prompt")
        if text is not None:
            if not isinstance(text, str) or not text:
                raise ValueError(
                    f"prompt {request_id!r}: 'prompt' must be a non-empty string, got {text!r}"
                )
            if self.tokenizer is None:
                raise ValueError(
                    f"prompt {request_id!r}: this model has no tokenizer (no tokenizer files in "
                    f"{self.model_dir}): give prompt_token_ids"
                )
            token_ids = self.tokenizer.encode(text, add_special_tokens=False)
        else:
            token_ids = _checked_token_ids(request_id, prompt["prompt_token_ids"])
        if not token_ids:
            raise ValueError(f"prompt {request_id!r}: prompt_token_ids is empty")
        salt = prompt.get("cache_salt")
        if salt is not None and not isinstance(salt, str):
            raise ValueError(f"prompt {request_id!r}: cache_salt must be a string, got {salt!r}")
        return PromptInput(request_id, token_ids, text=text, cache_salt=salt, original=prompt)
