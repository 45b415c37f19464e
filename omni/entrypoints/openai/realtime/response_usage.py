"""The usage object of a realtime response: its input tokens (text, audio, cached) and output
tokens (the text stage's, and with audio the talker's codec tokens)."""

from __future__ import annotations

from typing import Any

from omni.entrypoints.openai.context import Context
from omni.messages import OmniOutput


def usage(
    ctx: Context, last: OmniOutput | None, prompt_token_ids: list[int], want_audio: bool
) -> dict[str, Any]:
    """The GA usage object of a response (`last`: its final snapshot, None before any)."""
    async_omni = ctx.async_omni
    root = last.stages.get(async_omni.config.root_stages[0].name) if last else None
    num_input = root.num_prompt_tokens if root is not None else len(prompt_token_ids)
    cached = root.num_cached_tokens if root is not None else 0
    placeholder = getattr(async_omni.prompt_processor, "placeholder", {}).get("audio")
    audio_in = sum(1 for t in prompt_token_ids if t == placeholder) if placeholder else 0
    text_out = audio_out = 0
    for name, result in (last.stages if last else {}).items():
        if name == async_omni.text_stage:
            text_out = len(result.token_ids)
        elif want_audio and name != async_omni.audio_stage:
            audio_out += len(result.token_ids)  # the talker's codec tokens
    return {
        "total_tokens": num_input + text_out + audio_out,
        "input_tokens": num_input,
        "output_tokens": text_out + audio_out,
        "input_token_details": {
            "text_tokens": num_input - audio_in,
            "audio_tokens": audio_in,
            "image_tokens": 0,
            "cached_tokens": cached,
        },
        "output_token_details": {"text_tokens": text_out, "audio_tokens": audio_out},
    }
