"""User prompts -> normalized PromptInput for the root stage(s), validated before any work.

`PromptProcessor` is the base class of every family's prompt processor (a family names its
subclass in its manifest, omni/family.py): the family-specific part of the user-facing API. It
parses prompts, frames chat messages (`chat_text`: Omni.chat and the server's chat endpoint),
builds the speech prompt (`speech_messages`: the server's /v1/audio/speech) and lists the voices
a prompt may pick. This base takes text and token ids; its chat framing is the tokenizer's chat
template, else ChatML with media parts framed by the tokenizer's own media tokens.
"""

from __future__ import annotations

import json
import operator
import os
import re
from collections.abc import Callable, Sequence
from typing import Any

from omni.messages import PromptInput

ChatTurn = tuple[str, Sequence[tuple[str, str]]]
"""One chat message for `chat_text`: (role, parts), each part (kind, text) with kind "text",
"image" or "audio" (a media part's text is "": the prompt's images / audio hold the items),
"tool_calls" (an assistant's calls: JSON of [{id, type, function: {name, arguments}}]) or
"tool_call_id" (a tool message's answer to that call)."""
_TOOL_KINDS = ("tool_calls", "tool_call_id")

SPEECH_INSTRUCTION = "Repeat the user's text exactly, word for word, and say nothing else."
"""The system message of the speech prompt: a talker speaks the thinker's reply, so the speech
is the input only as far as the model follows this instruction."""

# Media parts without a chat template: the tokenizer's begin, placeholder and end tokens, by the
# attribute names transformers' Qwen omni tokenizers use; Qwen2.5-Omni's tokens when missing.
_MEDIA_TOKENS = {
    "image": (
        ("vision_bos_token", "<|vision_bos|>"),
        ("image_token", "<|IMAGE|>"),
        ("vision_eos_token", "<|vision_eos|>"),
    ),
    "audio": (
        ("audio_bos_token", "<|audio_bos|>"),
        ("audio_token", "<|AUDIO|>"),
        ("audio_eos_token", "<|audio_eos|>"),
    ),
}

_PROMPT_KEYS = ("prompt", "prompt_token_ids", "images", "audio", "cache_salt")


def _checked_token_ids(request_id: str, token_ids: Any) -> list[int]:
    """Plain ints (numpy integers accepted); anything else is a ValueError naming the entry.
    A list of plain non-negative ints (the common case) is checked at C speed: a per-entry
    Python loop cost ~3 ms of a cached 4k-token prompt's time to first token."""
    plain = isinstance(token_ids, list) and set(map(type, token_ids)) <= {int}
    if plain and (not token_ids or min(token_ids) >= 0):
        return list(token_ids)
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


def text_decoder(tokenizer: Any | None) -> Callable[[list[int]], str | None]:
    """token ids -> text without special tokens, as `tokenizer.decode(ids,
    skip_special_tokens=True)` (None without a tokenizer: token ids only). The driver decodes
    every streamed token, so a plain fast tokenizer (transformers' decode and _decode not
    overridden, no space cleanup) goes straight to its Rust backend: the same text without
    transformers' per-call argument handling (~10 us a call)."""
    if tokenizer is None:
        return lambda token_ids: None
    from transformers.tokenization_utils_base import PreTrainedTokenizerBase
    from transformers.tokenization_utils_tokenizers import TokenizersBackend

    backend: Any = getattr(tokenizer, "_tokenizer", None)
    plain = (
        type(tokenizer).decode is PreTrainedTokenizerBase.decode
        and getattr(type(tokenizer), "_decode", None) is TokenizersBackend._decode
        and not getattr(tokenizer, "clean_up_tokenization_spaces", True)
    )
    if plain and backend is not None:
        return lambda token_ids: backend.decode(token_ids, skip_special_tokens=True)
    slow = tokenizer
    return lambda token_ids: slow.decode(token_ids, skip_special_tokens=True)


def chat_text(
    tokenizer: Any, turns: Sequence[ChatTurn], tools: list[dict[str, Any]] | None = None
) -> str:
    """The prompt text for chat turns: `tokenizer`'s chat template when it has one (media parts
    as {"type": "image"} / {"type": "audio"}, as Hugging Face templates expect), else ChatML,
    `<|im_start|>ROLE\\nCONTENT<|im_end|>\\n` per turn then `<|im_start|>assistant\\n`, each
    media part as its begin, placeholder and end tokens (e.g. `<|vision_bos|><|IMAGE|><|vision_eos|>`).
    `tools` (OpenAI's function tools) go to the template, which renders them if it knows how;
    ChatML lists them in the system turn, with the Hermes form of a call (`_tools_system`)."""
    if getattr(tokenizer, "chat_template", None):
        return _templated(tokenizer, turns, tools)
    if tools:
        system = turns[0][1] if turns and turns[0][0] == "system" else []
        rest = turns[1:] if system else turns
        turns = [("system", [*system, ("text", _tools_system(tools, bool(system)))]), *rest]
    marks = {
        kind: "".join(getattr(tokenizer, attr, None) or default for attr, default in tokens)
        for kind, tokens in _MEDIA_TOKENS.items()
    }
    marks["tool_call_id"] = ""
    out = []
    for role, parts in turns:
        body = "".join(
            text if kind == "text" else _hermes(text) if kind == "tool_calls" else marks[kind]
            for kind, text in parts
        )
        out.append(f"<|im_start|>{role}\n{body}<|im_end|>\n")
    out.append("<|im_start|>assistant\n")
    return "".join(out)


def _templated(
    tokenizer: Any, turns: Sequence[ChatTurn], tools: list[dict[str, Any]] | None = None
) -> str:
    messages: list[dict[str, Any]] = []
    for role, turn_parts in turns:
        parts = [(kind, text) for kind, text in turn_parts if kind not in _TOOL_KINDS]
        if all(kind == "text" for kind, _ in parts):
            message: dict[str, Any] = {"role": role, "content": "".join(t for _, t in parts)}
        else:
            content = [
                {"type": "text", "text": text} if kind == "text" else {"type": kind}
                for kind, text in parts
            ]
            message = {"role": role, "content": content}
        for kind, text in turn_parts:  # as transformers' templates take them: arguments a dict
            if kind == "tool_calls":
                message["tool_calls"] = [_with_arguments_parsed(c) for c in json.loads(text)]
            elif kind == "tool_call_id":
                message["tool_call_id"] = text
        messages.append(message)
    text = tokenizer.apply_chat_template(
        messages, tools=tools, tokenize=False, add_generation_prompt=True
    )
    return str(text)


def _with_arguments_parsed(call: dict[str, Any]) -> dict[str, Any]:
    try:
        arguments = json.loads(call["function"]["arguments"])
    except ValueError:
        return call
    return call | {"function": call["function"] | {"arguments": arguments}}


def _tools_system(tools: list[dict[str, Any]], after_text: bool) -> str:
    """The tools in a system turn without a template, as Qwen's templates frame them."""
    listed = "\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools)
    return (
        ("\n\n" if after_text else "")
        + "# Tools\n\nYou may call one or more of these functions (signatures inside <tools>):"
        + f"\n<tools>\n{listed}\n</tools>\n\nTo call one, write its name and arguments as "
        + "JSON inside <tool_call> tags:\n<tool_call>\n"
        + '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )


def _hermes(calls: str) -> str:
    """An assistant's tool calls as text without a template (the Hermes form Qwen uses)."""
    return "".join(
        f'\n<tool_call>\n{{"name": {json.dumps(c["function"]["name"])}, "arguments": '
        f"{c['function']['arguments']}}}\n</tool_call>"
        for c in json.loads(calls)
    )


class PromptProcessor:
    """Tokenizes text prompts with the root stage's tokenizer. Multimodal families subclass it."""

    input_media: tuple[str, ...] = ()
    """The media a prompt may carry besides text ("images", "audio"); none: text only."""

    def __init__(self, model_dir: str) -> None:
        self.model_dir = model_dir
        self.tokenizer: Any = load_tokenizer(model_dir)
        """The root stage's tokenizer; None for a checkpoint without tokenizer files, which
        serves prompt_token_ids only (vLLM's skip_tokenizer_init)."""
        self.voices: list[str] = []
        """Speakers a prompt may pick with its "speaker" key (none for text-only pipelines)."""
        self.default_voice: str | None = None
        """The voice a prompt without "speaker" speaks in (None: no voices, or not one of them)."""

    def chat_text(
        self, turns: Sequence[ChatTurn], tools: list[dict[str, Any]] | None = None
    ) -> str:
        """The prompt text for chat turns (module function `chat_text`); a family whose
        tokenizers carry no template and frame chats otherwise overrides it."""
        return chat_text(self.tokenizer, turns, tools)

    def speech_messages(self, text: str, instructions: str | None = None) -> list[dict[str, str]]:
        """The chat that makes the pipeline say `text` (/v1/audio/speech); `instructions` are
        appended to its system message."""
        system = SPEECH_INSTRUCTION + (f" {instructions}" if instructions else "")
        return [{"role": "system", "content": system}, {"role": "user", "content": text}]

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
