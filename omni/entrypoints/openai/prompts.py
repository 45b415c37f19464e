"""Chat messages -> the prompt dict AsyncOmni takes: `{"prompt": text, "images": [...],
"audio": [...]}`.

The text comes from the tokenizer's chat template when it has one (multimodal parts passed as
`{"type": "image"}` / `{"type": "audio"}`, as Hugging Face templates expect); otherwise from the
Qwen framing `<|im_start|>ROLE\\nCONTENT<|im_end|>\\n` per message, then
`<|im_start|>assistant\\n`, with each image part as `<|vision_bos|><|IMAGE|><|vision_eos|>` and
each audio part as `<|audio_bos|><|AUDIO|><|audio_eos|>` where the part is (the placeholders the
Qwen2.5-Omni prompt processor expands). `developer` messages are framed as `system`.

`chat_prompt` is public so that tests (and users) can build exactly the prompt the server builds.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from omni.entrypoints.openai import media
from omni.entrypoints.openai.args import ServerArgs
from omni.entrypoints.openai.protocol import AudioPart, ChatMessage, ImagePart, TextPart

SPEECH_INSTRUCTION = (
    "Repeat the user's text exactly, word for word, and say nothing else."  # /v1/audio/speech
)


def chat_prompt(
    tokenizer: Any, messages: Sequence[ChatMessage | dict[str, Any]], args: ServerArgs | None = None
) -> dict[str, Any]:
    """The prompt for `messages` (ChatMessage models or the equivalent dicts). `args` is the
    media policy (default: data: URLs only). Raises OpenAIError (400) naming a bad part."""
    policy = args or ServerArgs(model_name="")
    parsed = [m if isinstance(m, ChatMessage) else ChatMessage.model_validate(m) for m in messages]
    images: list[bytes] = []
    audio: list[bytes] = []
    turns: list[tuple[str, list[tuple[str, str]]]] = []  # role, [(kind, text)]
    for i, message in enumerate(parsed):
        role = "system" if message.role == "developer" else message.role
        pieces: list[tuple[str, str]] = []
        content = message.content
        if isinstance(content, str):
            pieces.append(("text", content))
        elif content is not None:
            for j, part in enumerate(content):
                param = f"messages[{i}].content[{j}]"
                if isinstance(part, TextPart):
                    pieces.append(("text", part.text))
                elif isinstance(part, ImagePart):
                    images.append(
                        media.load_image(part.image_url.url, f"{param}.image_url", policy)
                    )
                    pieces.append(("image", ""))
                elif isinstance(part, AudioPart):
                    audio.append(
                        media.load_audio(
                            part.input_audio.data, part.input_audio.format, f"{param}.input_audio"
                        )
                    )
                    pieces.append(("audio", ""))
        turns.append((role, pieces))
    prompt: dict[str, Any] = {"prompt": render_turns(tokenizer, turns)}
    if images:
        prompt["images"] = images
    if audio:
        prompt["audio"] = audio
    return prompt


def speech_prompt(tokenizer: Any, text: str) -> dict[str, Any]:
    """/v1/audio/speech: a chat asking the model to repeat `text`. A talker speaks the thinker's
    reply, so the speech is the input only as far as the model follows the instruction."""
    return chat_prompt(
        tokenizer,
        [{"role": "system", "content": SPEECH_INSTRUCTION}, {"role": "user", "content": text}],
    )


def render_turns(tokenizer: Any, turns: Sequence[tuple[str, Sequence[tuple[str, str]]]]) -> str:
    """The prompt text of `turns` (role, [(kind, text)], kind "text", "image" or "audio") with
    the generation prompt: the chat template when the tokenizer has one, else the Qwen framing.
    The realtime endpoint renders its conversations with it, as chat_prompt does messages."""
    if getattr(tokenizer, "chat_template", None):
        return _templated(tokenizer, turns)
    return _qwen_framing(tokenizer, turns)


def _qwen_framing(tokenizer: Any, turns: Sequence[tuple[str, Sequence[tuple[str, str]]]]) -> str:
    marks = {
        "image": "<|vision_bos|>{}<|vision_eos|>".format(
            getattr(tokenizer, "image_token", None) or "<|IMAGE|>"
        ),
        "audio": "<|audio_bos|>{}<|audio_eos|>".format(
            getattr(tokenizer, "audio_token", None) or "<|AUDIO|>"
        ),
    }
    out = []
    for role, pieces in turns:
        body = "".join(text if kind == "text" else marks[kind] for kind, text in pieces)
        out.append(f"<|im_start|>{role}\n{body}<|im_end|>\n")
    out.append("<|im_start|>assistant\n")
    return "".join(out)


def _templated(tokenizer: Any, turns: Sequence[tuple[str, Sequence[tuple[str, str]]]]) -> str:
    messages: list[dict[str, Any]] = []
    for role, pieces in turns:
        if all(kind == "text" for kind, _ in pieces):
            messages.append({"role": role, "content": "".join(text for _, text in pieces)})
        else:
            messages.append(
                {
                    "role": role,
                    "content": [
                        {"type": "text", "text": text} if kind == "text" else {"type": kind}
                        for kind, text in pieces
                    ],
                }
            )
    return str(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
