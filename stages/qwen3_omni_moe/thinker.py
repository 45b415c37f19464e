"""Adapter `qwen3_omni_moe_thinker`: the Qwen3-Omni thinker on omni's paged attention.

The MoE text model runs on paged attention; transformers' audio tower and vision encoder run
whole items on sdpa, once per distinct item (an EncoderCache keyed by content hash; an image's
entry holds its merged embeddings and its deepstack features, added after the first text layers
at the image's positions, as transformers does). Positions are transformers' own 3-row rope
index (`get_rope_index` on the whole prompt, computed once per request on the host); past the
table a position p is p + delta on every row.

Outputs per fed token, the two the talker reads (transformers' generate takes them from the
thinker's `hidden_states`): `inputs_embeds` (`hidden_states[0]`: the embeddings with encoder rows
merged) and `accept_hidden_states` (`hidden_states[talker_config.accept_hidden_layer]`, captured
by transformers' own output recorder, so it is the same tensor: a layer's output before any
deepstack addition, or the normed last state when the index is the last one).

Extras: see stages/qwen3_omni_moe/prompt_processor.py.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
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
from stages.qwen2_5_omni.mrope import Item, decode_rows, find_items
from stages.qwen3_omni_moe import experts
from stages.qwen3_omni_moe.rope import audio_token_count, rope_index


@dataclass
class _Request:
    items: list[Item]
    positions: torch.Tensor | None  # [3, prompt_len] on the device; None: text only
    delta: int


class Qwen3OmniThinkerAdapter(StageModelBase):
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
            Qwen3OmniMoeThinkerConfig,
            Qwen3OmniMoeThinkerForConditionalGeneration,
        )

        register_paged_attention()
        hf_logging.disable_progress_bar()
        self.device = torch.device(device)
        with open(os.path.join(model_dir, "config.json")) as f:
            raw = json.load(f)
        config = Qwen3OmniMoeThinkerConfig(**raw["thinker_config"])
        self.accept_layer = int(raw["talker_config"]["accept_hidden_layer"])
        attn = {"text_config": ATTENTION_NAME, "vision_config": "sdpa", "audio_config": "sdpa"}
        model, info = Qwen3OmniMoeThinkerForConditionalGeneration.from_pretrained(
            model_dir, config=config, dtype=dtype, attn_implementation=attn,
            key_mapping={r"^thinker\.": ""}, output_loading_info=True, **load_kwargs(self.device),
        )  # fmt: skip
        if info["missing_keys"]:
            raise RuntimeError(f"thinker weights missing from {model_dir}: {info['missing_keys']}")
        self.model = model.to(self.device).eval()
        self.text_model = self.model.model.language_model
        text = config.text_config
        sizes = text.hidden_size, text.moe_intermediate_size
        experts.install(self.text_model, experts.choose(self.device, dtype, *sizes))
        if not 0 <= self.accept_layer <= text.num_hidden_layers:
            raise ValueError(
                f"talker_config.accept_hidden_layer={self.accept_layer} is outside the thinker's "
                f"0..{text.num_hidden_layers} hidden states"
            )
        self.dtype = dtype
        self.num_layers = text.num_hidden_layers
        self.num_kv_heads = text.num_key_value_heads
        self.head_dim = (
            getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
        )
        self.hidden_size = text.hidden_size
        self.vocab_size = text.vocab_size
        eos = self.model.generation_config.eos_token_id or raw.get("im_end_token_id")
        self.eos_token_id = eos[0] if isinstance(eos, list) else eos
        self.merge_size = config.vision_config.spatial_merge_size
        self.n_window = config.audio_config.n_window
        self.encoder_cache = EncoderCache(encoder_cache_bytes, encoder_cache_entries)
        self.reserved_bytes = encoder_cache_bytes
        self.max_image_pixels = max_image_pixels(model_dir)  # what the processor resizes to
        self.encoder_runs: Counter[str] = Counter()  # "image"/"audio" -> tower calls
        self._requests: dict[str, _Request] = {}

    # ---- engine hooks ---------------------------------------------------------------------------
    def check_inputs(self, stage_input: StageInput) -> None:
        """Every range has matching encoder inputs; the rope table is built here, once."""
        extras = stage_input.extras or {}
        items = find_items(stage_input.mm_inputs, extras)
        for item in items:
            expected = self._num_tokens(item, extras)
            if expected != item.mm.length:
                raise ValueError(
                    f"multimodal input {item.mm.identifier!r} spans {item.mm.length} tokens but "
                    f"its {item.modality} encodes to {expected}"
                )
        positions, delta = None, 0
        if items:
            table, delta = rope_index(self.model.model, stage_input.prompt_token_ids, extras)
            positions = table.to(self.device)
        self._requests[stage_input.request_id] = _Request(items, positions, delta)

    def release(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            self._requests.pop(request_id, None)

    # ---- model ----------------------------------------------------------------------------------
    def forward(self, inputs: ModelInputs) -> ModelOutputs:
        embeds = self.text_model.embed_tokens(inputs.input_ids)  # [T, D], a fresh tensor
        positions = inputs.positions.unsqueeze(0).repeat(3, 1)
        visual = torch.zeros(embeds.shape[0], dtype=torch.bool, device=embeds.device)
        deepstack: list[list[torch.Tensor]] = []
        starts = inputs.query_starts
        for row, entry in enumerate(inputs.scheduled):
            state = self._state(entry, inputs.request_extras.get(entry.request_id) or {})
            if state is None or state.positions is None:
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
                features = self._encode(item, extras)  # [1 + deepstack layers, L, D]
                span = slice(lo - item.mm.offset, hi - item.mm.offset)
                embeds[base + lo : base + hi] = features[0, span]
                if item.modality == "image":
                    visual[base + lo : base + hi] = True
                    deepstack.append([f[span] for f in features[1:]])
        kwargs: dict[str, Any] = {}
        if deepstack:  # rows in packing order, which is the order of `visual`'s True rows
            layers = zip(*deepstack, strict=True)
            kwargs["deepstack_visual_embeds"] = [torch.cat(rows) for rows in layers]
            kwargs["visual_pos_masks"] = visual.unsqueeze(0)
        out = self.text_model(
            inputs_embeds=embeds.unsqueeze(0),
            position_ids=positions.unsqueeze(1),  # [3, 1, T]
            use_cache=False,
            output_hidden_states=[self.accept_layer],
            omni_attn=inputs.attn,
            **kwargs,
        )
        accept = out.hidden_states[self.accept_layer][0]
        return ModelOutputs(
            out.last_hidden_state[0],
            extra={"inputs_embeds": embeds, "accept_hidden_states": accept},
        )

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.model.lm_head(hidden_states)

    # ---- padded (CUDA-graph) decode steps -------------------------------------------------------
    decode_position_rows = 3  # interleaved mrope: temporal, height, width
    decode_suffixes = False  # prompts merge encoder outputs and deepstack features
    decode_ids_on_device = True  # decode_prepare reads positions only

    def decode_graph_blocker(self) -> str | None:
        return experts.blocker(self.text_model)

    def decode_prepare(
        self,
        scheduled: list[ScheduledRequest],
        positions: np.ndarray,
        fed_frames: torch.Tensor | None = None,
    ) -> DecodeInputs | None:
        """Decode tokens of running requests only, p + delta on every row past a request's rope
        table (mrope.decode_rows). Prompt chunks run eagerly."""
        rows = decode_rows(scheduled, positions, self._requests.get)
        return None if rows is None else DecodeInputs(rows)

    def decode_forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attn: AttentionMetadata,
        embeds: torch.Tensor | None = None,
    ) -> ModelOutputs:
        """`forward` for decode tokens: no encoder rows and no deepstack features to add."""
        embeds = self.text_model.embed_tokens(input_ids)
        out = self.text_model(
            inputs_embeds=embeds.unsqueeze(0),
            position_ids=positions.unsqueeze(1),  # [3, 1, B]
            use_cache=False,
            output_hidden_states=[self.accept_layer],
            omni_attn=attn,
        )
        accept = out.hidden_states[self.accept_layer][0]
        return ModelOutputs(
            out.last_hidden_state[0],
            extra={"inputs_embeds": embeds, "accept_hidden_states": accept},
        )

    # ---- multimodal -----------------------------------------------------------------------------
    def _state(self, entry: ScheduledRequest, extras: Mapping[str, Any]) -> _Request | None:
        state = self._requests.get(entry.request_id)
        if state is None and entry.mm_inputs:  # added without check_inputs (direct runner use)
            raise RuntimeError(f"request {entry.request_id!r} has no rope table")
        return state

    @staticmethod
    def _positions(state: _Request, first: int, last: int) -> torch.Tensor:
        assert state.positions is not None
        table = state.positions
        start = min(max(first, table.shape[1]), last)  # first position past the table
        tail = torch.arange(start, last, device=table.device).add_(state.delta).expand(3, -1)
        return torch.cat([table[:, first:last], tail], dim=1)

    def _num_tokens(self, item: Item, extras: Mapping[str, Any]) -> int:
        if item.modality == "image":
            return int(np.prod(extras["image_grid_thw"][item.index])) // self.merge_size**2
        frames = int(np.sum(extras["feature_attention_mask"][item.index]))
        return audio_token_count(frames, self.n_window)

    def _encode(self, item: Item, extras: Mapping[str, Any]) -> torch.Tensor:
        """The item's encoder output [1 + deepstack layers, length, hidden] (audio: [1, L, D])."""
        identifier = item.mm.identifier
        cached = self.encoder_cache.get(identifier)
        if cached is not None:
            return cached
        features = self._tower(item.modality, extras, item.index)
        self.encoder_runs[item.modality] += 1
        if features.shape[1] != item.mm.length:
            raise RuntimeError(
                f"{item.modality} {identifier!r}: encoder gave {features.shape[1]} embeddings for "
                f"a range of {item.mm.length} tokens"
            )
        features = features.to(self.dtype)
        self.encoder_cache.put(identifier, features)
        return features

    def _tower(self, modality: str, extras: Mapping[str, Any], index: int) -> torch.Tensor:
        inner = self.model.model
        if modality == "image":
            pixels = torch.tensor(np.asarray(extras["pixel_values"][index]))
            grid = torch.tensor(np.asarray(extras["image_grid_thw"][index])).view(1, 3)
            out = inner.get_image_features(
                pixels.to(self.device, inner.visual.dtype), grid.to(self.device), return_dict=True
            )
            return torch.stack([out.pooler_output[0], *(f[0] for f in out.deepstack_features)])
        feats = torch.tensor(np.asarray(extras["input_features"][index])).unsqueeze(0)
        mask = torch.tensor(np.asarray(extras["feature_attention_mask"][index])).view(1, -1)
        out = inner.get_audio_features(
            feats.to(self.device, inner.audio_tower.dtype),
            mask.long().to(self.device),
            return_dict=True,
        )
        return out.last_hidden_state.unsqueeze(0)

    @torch.inference_mode()
    def profile_extra_work(self) -> None:
        """A GPU stage's memory profile (omni/engine/gpu_profile.py): each encoder on its
        largest item (the processor's largest image, 30 s of audio), whose activations are part
        of a step's peak. Nothing cached or counted."""
        for modality, extras in largest_items(self.model.config, self.max_image_pixels).items():
            self._tower(modality, extras, 0)


if TYPE_CHECKING:  # mypy checks the adapter against the contract its engine calls it by
    _CONTRACT: type[StageModel] = Qwen3OmniThinkerAdapter
