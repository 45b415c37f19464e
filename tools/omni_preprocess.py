"""Qwen2.5-Omni preprocessing without torchvision (reference for tests and examples).

``Qwen2_5OmniProcessor`` cannot be constructed without a torchvision video processor, so this
does its work for images and audio directly: the tokenizer, ``Qwen2VLImageProcessorPil`` and
``WhisperFeatureExtractor`` are all loaded from the checkpoint directory, and every placeholder
token in the prompt (``<|IMAGE|>`` / ``<|AUDIO|>``, one per item, in order) is expanded to as many
copies as the encoders will produce embeddings for.

Usage with the HF oracle::

    pre = OmniPreprocessor(path)
    inputs = pre("<|vision_bos|><|IMAGE|><|vision_eos|>What is this?", images=[pil_image])
    model.generate(**pre.generate_kwargs(inputs), thinker_max_new_tokens=8, ...)
"""

from __future__ import annotations

import os

import numpy as np
import torch


def audio_token_count(feature_len: int) -> int:
    """Embeddings the audio tower emits for ``feature_len`` mel frames (two stride-2 stages)."""
    return ((feature_len - 1) // 2 + 1 - 2) // 2 + 1


class OmniPreprocessor:
    """Tokenizer + image processor + feature extractor of one Qwen2.5-Omni directory."""

    def __init__(self, path: str | os.PathLike):
        from transformers import AutoTokenizer, WhisperFeatureExtractor
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
            Qwen2VLImageProcessorPil,
        )

        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.image_processor = Qwen2VLImageProcessorPil.from_pretrained(path)
        self.feature_extractor = WhisperFeatureExtractor.from_pretrained(path)

    def __call__(self, text: str, images=(), audios=()) -> dict[str, torch.Tensor]:
        """Return input_ids/attention_mask plus pixel_values/image_grid_thw and
        input_features/feature_attention_mask for whichever modalities were given.

        ``audios``: 1-D float arrays sampled at 16 kHz.
        """
        tok = self.tokenizer
        out: dict[str, torch.Tensor] = {}
        counts: dict[str, list[int]] = {tok.image_token: [], tok.audio_token: []}
        if images:
            img = self.image_processor(images=list(images), return_tensors="pt")
            out["pixel_values"] = img["pixel_values"]
            out["image_grid_thw"] = img["image_grid_thw"]
            merge = self.image_processor.merge_size
            counts[tok.image_token] = [int(g.prod()) // merge**2 for g in img["image_grid_thw"]]
        if audios:
            feats = self.feature_extractor(
                [np.asarray(a, dtype=np.float32) for a in audios],
                sampling_rate=self.feature_extractor.sampling_rate,
                padding="max_length",
                return_attention_mask=True,
                return_tensors="pt",
            )
            out["input_features"] = feats["input_features"]
            out["feature_attention_mask"] = feats["attention_mask"]
            lengths = feats["attention_mask"].sum(-1).tolist()
            counts[tok.audio_token] = [audio_token_count(int(n)) for n in lengths]
        text = _expand(text, counts)
        enc = tok(text, return_tensors="pt")
        out["input_ids"], out["attention_mask"] = enc["input_ids"], enc["attention_mask"]
        return out

    @staticmethod
    def generate_kwargs(inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Keyword names for ``Qwen2_5OmniForConditionalGeneration.generate``: pixels must go to
        the thinker only (``thinker_pixel_values``); the grid is shared with the talker."""
        return {("thinker_" + k if k == "pixel_values" else k): v for k, v in inputs.items()}


def _expand(text: str, counts: dict[str, list[int]]) -> str:
    """Replace the i-th occurrence of each placeholder by ``counts[placeholder][i]`` copies."""
    for token, numbers in counts.items():
        parts = text.split(token)
        if len(parts) - 1 != len(numbers):
            raise ValueError(
                f"prompt has {len(parts) - 1} {token} placeholders but {len(numbers)} inputs"
            )
        text = parts[0] + "".join(
            token * n + rest for n, rest in zip(numbers, parts[1:], strict=True)
        )
    return text
