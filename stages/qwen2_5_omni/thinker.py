"""Qwen2.5-Omni thinker on omni's paged attention: text decoder + vision and audio encoders.

Per step, for the fed tokens only: token embeddings, with every placeholder row replaced by the
matching row of its item's encoder output (computed once per item, kept in an EncoderCache, so a
prefix hit that ends inside an image costs no encoder run); 3-row mrope positions; then the text
model. Outputs: ``hidden_states`` (last layer after the norm) and ``extra["inputs_embeds"]`` (the
merged layer-0 input), the two per-token tensors the talker consumes (transformers' generate uses
the thinker's ``hidden_states[-1]`` and ``hidden_states[0]``).

Per-request extras: see stages/qwen2_5_omni/prompt_processor.py (``image_identifiers``, ``pixel_values``,
``image_grid_thw``, ``audio_identifiers``, ``input_features``, ``feature_attention_mask``).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from transformers.utils import logging as hf_logging

from omni.core.scheduler_output import ScheduledRequest
from omni.messages import StageInput
from omni.runtime.attention import ATTENTION_NAME, AttentionMetadata, register_paged_attention
from omni.runtime.stage_model import (
    DecodeInputs,
    ModelInputs,
    ModelOutputs,
    StageModel,
    StageModelBase,
)
from stages.causal_lm import load_kwargs
from stages.qwen2_5_omni.encoder_cache import EncoderCache
from stages.qwen2_5_omni.encoder_profile import largest_items, max_image_pixels
from stages.qwen2_5_omni.mrope import Item, MropeState, decode_rows, find_items, mrope_positions


class OmniThinkerAdapter(StageModelBase):
    def __init__(
        self,
        model_dir: str,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        encoder_cache_bytes: int = 256 << 20,
        encoder_cache_entries: int = 4096,
    ) -> None:
        from transformers import (
            Qwen2_5OmniThinkerConfig,
            Qwen2_5OmniThinkerForConditionalGeneration,
        )

        register_paged_attention()
        hf_logging.disable_progress_bar()
        self.device = torch.device(device)
        with open(os.path.join(model_dir, "config.json")) as f:
            raw = json.load(f)
        # A full Qwen2.5-Omni directory stores the thinker under "thinker."; a thinker-only
        # directory has it at the top level.
        full = raw.get("model_type") == "qwen2_5_omni"
        config = Qwen2_5OmniThinkerConfig(**raw["thinker_config"]) if full else None
        kwargs = {"key_mapping": {r"^thinker\.": ""}} if full else {}
        # Only the text decoder goes on paged attention; the encoders run whole items on sdpa.
        attn = {"text_config": ATTENTION_NAME, "vision_config": "sdpa", "audio_config": "sdpa"}
        model, info = Qwen2_5OmniThinkerForConditionalGeneration.from_pretrained(
            model_dir, config=config, dtype=dtype, attn_implementation=attn,
            output_loading_info=True, **kwargs, **load_kwargs(self.device),
        )  # fmt: skip
        if info["missing_keys"]:
            raise RuntimeError(f"thinker weights missing from {model_dir}: {info['missing_keys']}")
        self.model = model.to(self.device).eval()
        self.text_model = self.model.model.language_model
        text = self.model.config.text_config
        self.dtype = dtype
        self.num_layers = text.num_hidden_layers
        self.num_kv_heads = text.num_key_value_heads
        self.head_dim = (
            getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
        )
        self.hidden_size = text.hidden_size
        self.vocab_size = text.vocab_size
        eos = self.model.generation_config.eos_token_id or text.eos_token_id
        self.eos_token_id = eos[0] if isinstance(eos, list) else eos
        self.merge_size = self.model.config.vision_config.spatial_merge_size
        self.position_id_per_seconds = self.model.config.position_id_per_seconds
        self.encoder_cache = EncoderCache(encoder_cache_bytes, encoder_cache_entries)
        # Filled between steps up to its byte bound: a GPU stage's KV sizing counts it as taken.
        self.reserved_bytes = encoder_cache_bytes
        self.max_image_pixels = max_image_pixels(model_dir)  # what the processor resizes to
        self.encoder_runs: Counter[str] = Counter()  # "image"/"audio" -> tower calls
        self._mrope: dict[str, MropeState] = {}

    # ---- the adapter contract -------------------------------------------------------------------
    def forward(self, inputs: ModelInputs) -> ModelOutputs:
        embeds = self.text_model.embed_tokens(inputs.input_ids)  # [T, D], a fresh tensor
        positions = inputs.positions.unsqueeze(0).repeat(3, 1)  # text-only: p on every row
        starts = inputs.query_starts
        for row, entry in enumerate(inputs.scheduled):
            state = self._state(entry, inputs.request_extras.get(entry.request_id) or {})
            if state is None:
                continue
            first, last = (
                entry.num_computed_tokens,
                entry.num_computed_tokens + len(entry.token_ids),
            )
            base = starts[row] - first  # packed row of position p is base + p
            positions[:, base + first : base + last] = self._positions(state, first, last)
            extras = inputs.request_extras[entry.request_id]
            for item in state.items:
                lo, hi = max(first, item.mm.offset), min(last, item.mm.offset + item.mm.length)
                if lo >= hi:
                    continue  # not fed this step (cached prefix or a later chunk)
                features = self._encode(item, extras)
                embeds[base + lo : base + hi] = features[lo - item.mm.offset : hi - item.mm.offset]
        out = self.text_model(
            inputs_embeds=embeds.unsqueeze(0),
            position_ids=positions.unsqueeze(1),  # [3, 1, T]
            use_cache=False,
            omni_attn=inputs.attn,
        )
        return ModelOutputs(out.last_hidden_state[0], extra={"inputs_embeds": embeds})

    decode_position_rows = 3  # mrope: temporal, height, width
    decode_suffixes = False  # prompts merge encoder outputs and build the mrope table
    decode_ids_on_device = True  # decode_prepare reads positions only (a decode token's is
    # past its prompt's mrope table, so it never asks for an eager step there)

    def decode_graph_blocker(self) -> str | None:
        return None

    def decode_prepare(
        self,
        scheduled: list[ScheduledRequest],
        positions: np.ndarray,
        fed_frames: torch.Tensor | None = None,
    ) -> DecodeInputs | None:
        """Decode tokens of running requests only, each multimodal request's shifted by its delta
        (mrope.decode_rows). Prompt chunks and (re)admitted requests run eagerly: their forward
        merges encoder outputs and builds the mrope table."""
        rows = decode_rows(scheduled, positions, self._mrope.get)
        return None if rows is None else DecodeInputs(rows)

    def decode_forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attn: AttentionMetadata,
        embeds: torch.Tensor | None = None,
    ) -> ModelOutputs:
        embeds = self.text_model.embed_tokens(input_ids)
        out = self.text_model(
            inputs_embeds=embeds.unsqueeze(0),
            position_ids=positions.unsqueeze(1),  # [3, 1, B]
            use_cache=False,
            omni_attn=attn,
        )
        return ModelOutputs(out.last_hidden_state[0], extra={"inputs_embeds": embeds})

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.model.lm_head(hidden_states)

    def release(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            self._mrope.pop(request_id, None)

    def check_inputs(self, stage_input: StageInput) -> None:
        """Called by the engine on add_request: every range has matching encoder inputs."""
        extras = stage_input.extras or {}
        for item in find_items(stage_input.mm_inputs, extras):
            expected = self._num_tokens(item, extras)
            if expected != item.mm.length:
                raise ValueError(
                    f"multimodal input {item.mm.identifier!r} spans {item.mm.length} tokens but "
                    f"its {item.modality} encodes to {expected}"
                )

    # ---- multimodal -----------------------------------------------------------------------------
    def _state(self, entry: ScheduledRequest, extras: Mapping[str, Any]) -> MropeState | None:
        """Per-request mrope table, built when the request is (re)admitted with its ranges."""
        if entry.is_new:
            self._mrope.pop(entry.request_id, None)
            if entry.mm_inputs:
                items = find_items(entry.mm_inputs, extras)
                positions, delta = self.mrope_positions(items, extras)  # built on the host
                positions = positions.to(self.device)
                self._mrope[entry.request_id] = MropeState(items, positions, delta)
        return self._mrope.get(entry.request_id)

    @staticmethod
    def _positions(state: MropeState, first: int, last: int) -> torch.Tensor:
        start = min(max(first, state.positions.shape[1]), last)  # first position past the table
        tail = torch.arange(start, last, device=state.positions.device)
        tail = tail.add_(state.delta).expand(3, -1)
        return torch.cat([state.positions[:, first:last], tail], dim=1)

    def mrope_positions(
        self, items: list[Item], extras: Mapping[str, Any]
    ) -> tuple[torch.Tensor, int]:
        """The prompt's 3-row positions up to its last item's end, and the delta after it."""
        return mrope_positions(items, extras, self.merge_size, self.position_id_per_seconds)

    def _num_tokens(self, item: Item, extras: Mapping[str, Any]) -> int:
        if item.modality == "image":
            return int(np.prod(extras["image_grid_thw"][item.index])) // self.merge_size**2
        frames = int(np.sum(extras["feature_attention_mask"][item.index]))
        return ((frames - 1) // 2 + 1 - 2) // 2 + 1

    def _encode(self, item: Item, extras: Mapping[str, Any]) -> torch.Tensor:
        """The item's encoder output [length, hidden]: from the cache, or one tower run."""
        identifier = item.mm.identifier
        cached = self.encoder_cache.get(identifier)
        if cached is not None:
            return cached
        features = self._tower(item.modality, extras, item.index)
        self.encoder_runs[item.modality] += 1
        if features.shape[0] != item.mm.length:
            raise RuntimeError(
                f"{item.modality} {identifier!r}: encoder gave {features.shape[0]} embeddings for "
                f"a range of {item.mm.length} tokens"
            )
        features = features.to(self.dtype)
        self.encoder_cache.put(identifier, features)
        return features

    def _tower(self, modality: str, extras: Mapping[str, Any], index: int) -> torch.Tensor:
        """One item's encoder output [tokens, hidden], in the tower's dtype."""
        inner = self.model.model
        device = self.device
        if modality == "image":
            # Copies: arrays that came through Ray are read-only, which torch warns about.
            pixels = torch.tensor(np.asarray(extras["pixel_values"][index]))
            pixels = pixels.to(device, inner.visual.dtype)
            grid = torch.tensor(np.asarray(extras["image_grid_thw"][index])).view(1, 3)
            return inner.get_image_features(
                pixels, grid.to(device), return_dict=True
            ).pooler_output[0]
        feats = torch.tensor(np.asarray(extras["input_features"][index])).unsqueeze(0)
        mask = torch.tensor(np.asarray(extras["feature_attention_mask"][index]))
        return inner.get_audio_features(
            feats.to(device, inner.audio_tower.dtype),
            mask.view(1, -1).long().to(device),
            return_dict=True,
        ).last_hidden_state

    @torch.inference_mode()
    def profile_extra_work(self) -> None:
        """A GPU stage's memory profile (omni/engine/gpu_profile.py): each encoder on its
        largest item, whose activations are part of a step's peak. Nothing cached or counted."""
        for modality, extras in largest_items(self.model.config, self.max_image_pixels).items():
            self._tower(modality, extras, 0)


if TYPE_CHECKING:  # mypy checks the adapter against the contract its engine calls it by
    _CONTRACT: type[StageModel] = OmniThinkerAdapter
