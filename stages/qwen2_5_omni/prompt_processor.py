"""Qwen2.5-Omni prompts with images and audio -> PromptInput for the thinker stage.

Prompt dict keys: ``prompt`` or ``prompt_token_ids``, ``images``, ``audio``, ``cache_salt``.

Placement. Each placeholder token (``<|IMAGE|>`` / ``<|AUDIO|>``, in the text or in the token ids)
stands for the next item of its modality, in order. A run of consecutive equal placeholders is one
item: a single token is expanded to the item's embedding count, a run of exactly that count is
taken as already expanded (e.g. token ids copied from an earlier PromptInput); other run lengths
are an error. A placeholder not already framed by its begin/end tokens (``<|vision_bos|>`` ...
``<|vision_eos|>``, ``<|audio_bos|>`` ... ``<|audio_eos|>``) gets them, because the thinker's 3-D
rope positions assume them. If the prompt has items but no placeholder at all, a minimal chat turn
is built: ``<|im_start|>user\\n`` + one framed placeholder per image, then per audio, + the text +
``<|im_end|>\\n<|im_start|>assistant\\n``.

Media. Images: path, encoded bytes or PIL image, converted to RGB. Audio: WAV path or bytes, or
``(waveform, sample_rate)``; resampled to 16 kHz by linear interpolation, at most 30 s (longer
audio is rejected rather than cut, which is what the Whisper front end would do silently).

Extras for the thinker (numpy arrays, cheap to ship through Ray), present only for modalities used:
``image_identifiers`` (list), ``pixel_values`` (list of [patches, C*T*P*P] float32),
``image_grid_thw`` ([num_images, 3] int64); ``audio_identifiers`` (list), ``input_features`` (list
of [mel, frames] float32, valid frames only), ``feature_attention_mask`` (list of [frames] int64
ones), ``audio_feature_lengths`` ([num_audios] int64); ``mm_identifiers`` lists every item in
prompt order. Per-modality lists are in placeholder order; index i of each belongs together.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from omni.core.request import MultiModalInput
from omni.engine.prompt_processor import PromptProcessor
from omni.messages import PromptInput
from stages.qwen2_5_omni import media
from stages.qwen2_5_omni.input_processors import DEFAULT_SPEAKER
from stages.qwen2_5_omni.part_loader import load_speakers

MODALITIES = ("images", "audio")


def audio_token_count(num_frames: int) -> int:
    """Embeddings the audio tower emits for ``num_frames`` mel frames (two stride-2 stages)."""
    return ((num_frames - 1) // 2 + 1 - 2) // 2 + 1


class OmniPromptProcessor(PromptProcessor):
    """Tokenizer + Qwen2-VL image processor + Whisper feature extractor of a checkpoint."""

    input_media = MODALITIES
    audio_padding = "max_length"
    """The feature extractor's padding, as the family's HF processor pads one audio."""

    def audio_tokens(self, num_frames: int) -> int:
        """Embeddings the audio tower emits for num_frames mel frames."""
        return audio_token_count(num_frames)

    def __init__(
        self, model_dir: str, *, max_pixels: int = 4096 * 4096, max_audio_seconds: float = 30.0
    ) -> None:
        from transformers import WhisperFeatureExtractor
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
            Qwen2VLImageProcessorPil,  # the PIL backend: no torchvision needed
        )
        from transformers.utils import logging as hf_logging

        # Loading reads the composite config, whose talker part makes transformers warn that text
        # token ids (e.g. tts_text_start_token_id) lie outside the codec vocabulary: true of the
        # real checkpoint too, and nothing to do with prompts. Errors still show.
        level = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()
        try:
            super().__init__(model_dir)
            self.image_processor = Qwen2VLImageProcessorPil.from_pretrained(model_dir)
            self.feature_extractor = WhisperFeatureExtractor.from_pretrained(model_dir)
        finally:
            hf_logging.set_verbosity(level)
        self.voices = sorted(load_speakers(model_dir)) if _has_speakers(model_dir) else []
        # what the talker and token2wav fall back to; a checkpoint without it has no default
        self.default_voice = DEFAULT_SPEAKER if DEFAULT_SPEAKER in self.voices else None
        self.max_pixels = max_pixels  # input guard on the decoded image, not the resize target
        self.max_audio_seconds = min(max_audio_seconds, self.feature_extractor.chunk_length)
        tok = self.tokenizer
        ids = tok.convert_tokens_to_ids
        self.placeholder = {"images": ids(tok.image_token), "audio": ids(tok.audio_token)}
        self.frame = {
            "images": (ids(tok.vision_bos_token), ids(tok.vision_eos_token)),
            "audio": (ids(tok.audio_bos_token), ids(tok.audio_eos_token)),
        }
        self._turn_start = [ids("<|im_start|>"), *tok.encode("user\n", add_special_tokens=False)]
        self._turn_end = [
            ids("<|im_end|>"),
            *tok.encode("\n", add_special_tokens=False),
            ids("<|im_start|>"),
            *tok.encode("assistant\n", add_special_tokens=False),
        ]

    def __call__(self, request_id: str, prompt: Any) -> PromptInput:
        items: dict[str, list] = {"images": [], "audio": []}
        original = prompt
        speaker = None
        if isinstance(prompt, dict):
            prompt = dict(prompt)
            for key in MODALITIES:
                items[key] = _as_list(prompt.pop(key, None), key)
            speaker = prompt.pop("speaker", None)
        # keys, text/ids, salt: validated there
        base = dataclasses.replace(super().__call__(request_id, prompt), original=original)
        where = f"prompt {request_id!r}"
        token_ids = list(base.prompt_token_ids)
        if not any(self.placeholder[k] in token_ids for k in MODALITIES) and any(items.values()):
            token_ids = self._chat_turn(token_ids, items)
        runs = self._find_runs(token_ids)
        for key in MODALITIES:  # counts first: the cheapest check, before decoding anything
            num_runs = sum(1 for run in runs if run[0] == key)
            if num_runs != len(items[key]):
                raise ValueError(
                    f"{where}: {num_runs} {key} placeholder(s) in the prompt but "
                    f"{len(items[key])} item(s) in {key!r}"
                )
        loaded = {
            "images": [
                _named(where, "images", i, media.load_image, x, self.max_pixels)
                for i, x in enumerate(items["images"])
            ],
            "audio": [
                _named(where, "audio", i, media.load_audio, x, self.max_audio_seconds)
                for i, x in enumerate(items["audio"])
            ],
        }
        extras, counts = self._encoder_inputs(where, loaded)
        token_ids, mm_inputs = self._expand(where, token_ids, runs, extras, counts)
        if extras:
            extras["mm_identifiers"] = [item.identifier for item in mm_inputs]
        if speaker is not None:
            if speaker not in self.voices:
                raise ValueError(
                    f"{where}: speaker {speaker!r} is not a voice of this model; voices: "
                    f"{self.voices}"
                )
            extras["speaker"] = speaker  # read by the talker and token2wav edges
        return dataclasses.replace(
            base, prompt_token_ids=token_ids, mm_inputs=tuple(mm_inputs), extras=extras
        )

    # ---- steps ---------------------------------------------------------------------------------
    def _chat_turn(self, token_ids: list[int], items: dict[str, list]) -> list[int]:
        framed: list[int] = []
        for key in MODALITIES:
            bos, eos = self.frame[key]
            framed += [bos, self.placeholder[key], eos] * len(items[key])
        return self._turn_start + framed + token_ids + self._turn_end

    def _find_runs(self, token_ids: list[int]) -> list[tuple[str, int, int]]:
        """(modality, start, length) of every maximal run of one placeholder id, in order."""
        kinds = {v: k for k, v in self.placeholder.items()}
        runs: list[tuple[str, int, int]] = []
        i = 0
        while i < len(token_ids):
            key = kinds.get(token_ids[i])
            if key is None:
                i += 1
                continue
            j = i
            while j < len(token_ids) and token_ids[j] == token_ids[i]:
                j += 1
            runs.append((key, i, j - i))
            i = j
        return runs

    def _encoder_inputs(self, where: str, loaded: dict[str, list]) -> tuple[dict, dict]:
        extras: dict[str, Any] = {}
        counts: dict[str, list[int]] = {"images": [], "audio": []}
        merge = self.image_processor.merge_size
        for i, image in enumerate(loaded["images"]):
            try:
                out = self.image_processor(images=[image], return_tensors="np")
            except ValueError as e:  # e.g. the resize rejects the shape
                raise ValueError(f"{where}: images[{i}]: {e}") from None
            grid = np.asarray(out["image_grid_thw"][0], dtype=np.int64)
            extras.setdefault("image_identifiers", []).append(media.image_identifier(image))
            extras.setdefault("pixel_values", []).append(
                np.asarray(out["pixel_values"], np.float32)
            )
            extras.setdefault("image_grid_thw", []).append(grid)
            counts["images"].append(int(grid.prod()) // merge**2)
        for i, waveform in enumerate(loaded["audio"]):
            out = self.feature_extractor(
                [waveform],
                sampling_rate=media.SAMPLE_RATE,
                padding=self.audio_padding,  # as the HF processor: the log-mel clamp sees it
                return_attention_mask=True,
                return_tensors="np",
            )
            num_frames = int(out["attention_mask"][0].sum())
            if self.audio_tokens(num_frames) < 1:
                raise ValueError(
                    f"{where}: audio[{i}]: audio of {waveform.size} samples is too short"
                )
            features = np.ascontiguousarray(out["input_features"][0, :, :num_frames], np.float32)
            extras.setdefault("audio_identifiers", []).append(media.audio_identifier(waveform))
            extras.setdefault("input_features", []).append(features)
            extras.setdefault("feature_attention_mask", []).append(np.ones(num_frames, np.int64))
            extras.setdefault("audio_feature_lengths", []).append(num_frames)
            counts["audio"].append(self.audio_tokens(num_frames))
        # Per-prompt arrays in transformers' shapes, as the talker's rope index takes them too.
        if "image_grid_thw" in extras:
            extras["image_grid_thw"] = np.stack(extras["image_grid_thw"])
        if "audio_feature_lengths" in extras:
            extras["audio_feature_lengths"] = np.asarray(extras["audio_feature_lengths"], np.int64)
        return extras, counts

    def _expand(
        self, where: str, token_ids: list[int], runs: list, extras: dict, counts: dict
    ) -> tuple[list[int], list[MultiModalInput]]:
        """Expand placeholder runs, frame them, and record each item's range."""
        out: list[int] = []
        mm_inputs: list[MultiModalInput] = []
        index = {"images": 0, "audio": 0}
        names = {"images": "image_identifiers", "audio": "audio_identifiers"}
        previous_end = 0
        for key, start, length in runs:
            i = index[key]
            index[key] += 1
            count = counts[key][i]
            if length not in (1, count):
                raise ValueError(
                    f"{where}: {key}[{i}]: placeholder run of {length} tokens; expected 1 or {count}"
                )
            bos, eos = self.frame[key]
            out += token_ids[previous_end:start]
            if not out or out[-1] != bos:
                out.append(bos)
            mm_inputs.append(MultiModalInput(extras[names[key]][i], len(out), count))
            out += [self.placeholder[key]] * count
            previous_end = start + length
            if previous_end >= len(token_ids) or token_ids[previous_end] != eos:
                out.append(eos)
        out += token_ids[previous_end:]
        return out, mm_inputs


def _as_list(value: Any, key: str) -> list:
    """`images` / `audio` as a list: None -> [], a list as is, one bare item -> [item]."""
    if value is None:
        return []
    if isinstance(value, list):
        return value
    if key == "images" and isinstance(value, tuple):
        return list(value)
    if key == "audio" and isinstance(value, tuple) and not _is_waveform_pair(value):
        return list(value)
    return [value]


def _is_waveform_pair(value: tuple) -> bool:
    """Whether a bare `audio` tuple is one (waveform, sample_rate) rather than two items: a
    waveform alone is no audio item, so any pair that does not start with one (a WAV path, WAV
    bytes or another pair) is a waveform and its rate, which load_audio checks (16000.0 is
    16000; 16000.5 or "16000" are errors naming the rate, not "got ndarray")."""
    items = str | os.PathLike | bytes | bytearray | memoryview | tuple
    return len(value) == 2 and not isinstance(value[0], items)


def _named(
    where: str, key: str, i: int, loader: Callable[[Any, Any], Any], item: Any, limit: float
) -> Any:
    try:
        return loader(item, limit)
    except ValueError as e:
        raise ValueError(f"{where}: {key}[{i}]: {e}") from None


def _has_speakers(model_dir: str) -> bool:
    return os.path.exists(os.path.join(model_dir, "spk_dict.pt"))
