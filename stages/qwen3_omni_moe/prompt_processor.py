"""Qwen3-Omni prompts with images and audio -> PromptInput for the thinker stage.

The Qwen2.5-Omni processor's rules (stages/qwen2_5_omni/prompt_processor.py: placeholders, media,
extras), with Qwen3-Omni's differences:
- audio: features of the audio alone (`Qwen3OmniMoeProcessor` pads to the longest item, so one
  item is not padded) and transformers' `_get_feat_extract_output_lengths` token count;
- a prompt without `<|im_start|>` becomes one user turn (`<|im_start|>user\\n` ... `<|im_end|>\\n
  <|im_start|>assistant\\n`): the talker speaks the reply of the last assistant turn;
- voices: the checkpoint's `talker_config.speaker_id` names, matched case-insensitively as
  generate does (`speaker.lower()`); default "Ethan" (generate's), or the first voice in sorted
  order for a checkpoint without "ethan" (where generate's default raises a KeyError);
- extras["token_layout"]: the token ids the talker edge needs (input_processors.py).

Without torchvision, `Qwen3OmniMoeProcessor` cannot be built (its video processor imports it):
this processor does its work for images and audio directly; video input is not supported.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from omni.core.request import MultiModalInput
from omni.messages import PromptInput
from stages.qwen2_5_omni.prompt_processor import OmniPromptProcessor
from stages.qwen3_omni_moe.rope import audio_token_count

DEFAULT_VOICE = "Ethan"
SAMPLE_RATE = 24000


class Qwen3OmniPromptProcessor(OmniPromptProcessor):
    audio_padding = "longest"

    def __init__(self, model_dir: str, **kwargs: Any) -> None:
        super().__init__(model_dir, **kwargs)
        with open(os.path.join(model_dir, "config.json")) as f:
            raw = json.load(f)
        thinker, talker = raw["thinker_config"], raw["talker_config"]
        self.n_window = int(thinker["audio_config"].get("n_window", 50))
        self.voices = sorted(str(name).lower() for name in talker.get("speaker_id") or {})
        default = DEFAULT_VOICE.lower()
        self.default_voice = (
            default if default in self.voices or not self.voices else self.voices[0]
        )
        self.layout = {
            "im_start": raw["im_start_token_id"],
            "user": raw["user_token_id"],
            "assistant": raw["assistant_token_id"],
            "tts_pad": raw["tts_pad_token_id"],
            "multimodal": [thinker[f"{k}_token_id"] for k in ("audio", "image", "video")],
        }

    def audio_tokens(self, num_frames: int) -> int:
        return audio_token_count(num_frames, self.n_window)

    def __call__(self, request_id: str, prompt: Any) -> PromptInput:
        if isinstance(prompt, dict) and prompt.get("speaker") is not None:
            prompt = {**prompt, "speaker": str(prompt["speaker"]).lower()}
        base = super().__call__(request_id, prompt)
        ids, items = list(base.prompt_token_ids), base.mm_inputs
        if self.layout["im_start"] not in ids:
            shift = len(self._turn_start)
            ids = self._turn_start + ids + self._turn_end
            items = tuple(MultiModalInput(m.identifier, m.offset + shift, m.length) for m in items)
        # every prompt names its voice (the checkpoint's default when it names none)
        extras = {"speaker": self.default_voice, **base.extras, "token_layout": self.layout}
        return dataclasses.replace(base, prompt_token_ids=ids, mm_inputs=items, extras=extras)
