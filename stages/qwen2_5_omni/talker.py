"""Adapter `qwen2_5_omni_talker`: the Qwen2.5-Omni talker (thinker states -> codec tokens).

The talker is an ordinary causal decoder on omni's paged attention, except for its inputs: each
position's input embedding comes from the thinker (see talker_inputs.py), so forward() builds, for
any fed range [num_computed, num_computed + n) of a request, exactly what transformers feeds at
those positions, from the request's StageInput.extras (written by input_processors.thinker_to_talker).
That makes prefix hits, chunked prefill, decode and recompute after preemption all feed the same
embeddings and 3-row mrope positions as one uninterrupted transformers generate.

Sampling differences from a plain LM, both applied in compute_logits because they need the
request's codec history: generate suppresses the codec bos token and applies a repetition penalty
(transformers' default 1.05) over every codec id seen (the codec prompt ids and the generated ones).

Per step, nothing is built per request on the device: every request's text rows live in one row
arena (omni/runtime/row_arena.py), the step is planned on the host as index arrays
(talker_step.py) that go over in one upload, and the inputs are one gather + one embedding
lookup; the codec history is a device seen-mask (talker_penalty.py). No host-device sync.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import (
    Qwen2_5OmniTalkerForConditionalGeneration,
)
from transformers.utils import logging as hf_logging

from omni.core.sampling_params import SamplingParams
from omni.core.scheduler_output import ScheduledRequest
from omni.messages import InputDelta, StageInput
from omni.runtime.attention import ATTENTION_NAME, AttentionMetadata, register_paged_attention
from omni.runtime.host_upload import upload
from omni.runtime.row_arena import RowArena
from omni.runtime.stage_model import (
    DecodeInputs,
    ModelInputs,
    ModelOutputs,
    StageModel,
    StageModelBase,
)
from stages.qwen2_5_omni.part_loader import load_part, load_rows, load_speakers, part_config
from stages.qwen2_5_omni.talker_inputs import TalkerRequestState, build_state, check_extras
from stages.qwen2_5_omni.talker_penalty import SeenCodes
from stages.qwen2_5_omni.talker_step import TalkerStep, plan_step


def speaker_key(name: str) -> int:
    """The id standing for a speaker at position P of the talker's prompt token ids. The talker
    never embeds prompt ids (its prompt embeddings come from extras); they only key the prefix
    cache, so any stable per-speaker value works and processors need no checkpoint access."""
    return zlib.crc32(f"qwen2_5_omni speaker {name}".encode())


class OmniTalkerAdapter(StageModelBase):
    # A decode token's codec embedding and seen mark come from the device ids (decode_forward,
    # sample_codes); decode_prepare reads positions and text rows only.
    decode_ids_on_device = True

    def __init__(
        self,
        model_dir: str,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        register_paged_attention()
        hf_logging.disable_progress_bar()
        self.device = torch.device(device)
        config = part_config(model_dir, "talker")
        config._attn_implementation = ATTENTION_NAME
        talker = Qwen2_5OmniTalkerForConditionalGeneration(config)
        self.talker = talker.to(device=self.device, dtype=dtype).eval()
        load_part(self.talker, model_dir, "talker.")  # copies each tensor onto the device
        self.dtype = dtype
        self.num_layers = config.num_hidden_layers
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = (
            getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        )
        self.hidden_size = config.hidden_size
        # Prompt ids are thinker ids and speaker keys, used for hashing only (never embedded).
        self.vocab_size = 2**32
        self.eos_token_id = config.tts_codec_end_token_id
        self.codec_bos = config.tts_codec_start_token_id
        self.speakers = {n: int(v["bos_token"]) for n, v in load_speakers(model_dir).items()}
        # The few thinker embedding rows the talker's inputs use (not the thinker's whole table).
        named = {"tts_eos": config.tts_text_end_token_id, "tts_pad": config.tts_text_pad_token_id}
        named.update({f"spk:{n}": i for n, i in self.speakers.items()})
        rows = load_rows(model_dir, "thinker.model.embed_tokens.weight", list(named.values()))
        # On the host: a request's inputs are assembled there (talker_inputs.build_state), once,
        # then written to the text arena on the device.
        self.thinker_rows = {k: rows[i].to(dtype) for k, i in named.items()}
        self._states: dict[str, TalkerRequestState] = {}
        thinker_dim = config.embedding_size  # the thinker's hidden size
        self._text = RowArena(thinker_dim, dtype, self.device)
        self._seen = SeenCodes(config.vocab_size, self.device)
        # The last forward's sampled rows: request ids, then (seen rows, penalty groups,
        # penalties) for compute_logits.
        self._sample_ids: list[str] = []
        self._penalty: tuple[torch.Tensor, torch.Tensor, list[float]] | None = None

    # ---- engine hooks ---------------------------------------------------------------------
    def check_inputs(self, stage_input: StageInput) -> None:
        check_extras(stage_input.extras)
        speaker = stage_input.extras.get("speaker", "Chelsie")
        if speaker not in self.speakers:
            raise ValueError(f"unknown speaker {speaker!r}; available: {sorted(self.speakers)}")
        # Built here, not in forward(): an input it trips over is then rejected alone instead of
        # failing every talker request of the step.
        self._add_state(stage_input.request_id, stage_input.extras)

    def _add_state(self, request_id: str, extras: Mapping[str, Any]) -> TalkerRequestState:
        state, text = build_state(extras, self.talker, self.thinker_rows, self.speakers)
        self.release([request_id])
        # A streaming request grows by a row per thinker token: room for as many again.
        self._text.add(request_id, text, spare=0 if state.finished else text.shape[0])
        self._states[request_id] = state
        return state

    def release(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            self._states.pop(request_id, None)
            self._text.release(request_id)
            self._seen.release(request_id)

    def input_limit(self, request_id: str) -> int | None:
        return self._states[request_id].input_limit

    def extend_inputs(self, request_id: str, delta: InputDelta) -> int | None:
        """The thinker's next rows (input_processors.thinker_delta): decode steps that need them can
        run; once it has finished, every later step can."""
        state = self._states[request_id]
        extras = delta.extras
        hidden, embeds = extras.get("thinker_hidden"), extras.get("thinker_embeds")
        for rows in state.extend(hidden, embeds, delta.finished):
            self._text.append(request_id, rows)
        return state.input_limit

    # ---- model ----------------------------------------------------------------------------
    def _state(
        self, entry: ScheduledRequest, extras: Mapping[str, Any]
    ) -> TalkerRequestState | None:
        if not extras:
            return None  # warm-up or a bare codec prompt: codec embeddings at plain positions
        state = self._states.get(entry.request_id)
        return state if state is not None else self._add_state(entry.request_id, extras)

    def forward(self, inputs: ModelInputs) -> ModelOutputs:
        extras = inputs.request_extras
        # Every state first: adding one to the arena may move the others' rows.
        states = [self._state(e, extras.get(e.request_id, {})) for e in inputs.scheduled]
        step = plan_step(inputs.scheduled, states, self._text.start, self._seen.slot)
        text, codec_ids, no_codec, positions = self._take_step(step)
        codec = self.talker.get_input_embeddings()(codec_ids)
        embeds = text + codec.masked_fill(no_codec.unsqueeze(1), 0.0)
        return self._body(embeds, positions, inputs.attn)

    def _take_step(self, step: TalkerStep) -> tuple[torch.Tensor, ...]:
        """Upload the planned step, mark its codes seen and keep its sampled rows for
        compute_logits; returns (text rows, codec ids, no-codec flags, positions) on the device."""
        (text_index, codec_ids, no_codec, positions, mark_slots, mark_ids, sample_slots, groups) = (
            upload(step.arrays(), self.device)
        )
        if step.mark_ids:
            self._seen.mark(mark_slots, mark_ids)
        self._sample_ids = step.sample_ids
        self._penalty = (sample_slots, groups, step.penalties) if step.penalties else None
        return self._text.rows.index_select(0, text_index), codec_ids, no_codec, positions

    def _body(
        self, embeds: torch.Tensor, positions: torch.Tensor, attn: AttentionMetadata
    ) -> ModelOutputs:
        out = self.talker.model(
            inputs_embeds=self.talker.thinker_to_talker_proj(embeds).unsqueeze(0),
            position_ids=positions.unsqueeze(1),
            use_cache=False,
            omni_attn=attn,
        )
        return ModelOutputs(hidden_states=out.last_hidden_state[0])

    # ---- padded (CUDA-graph) decode steps -------------------------------------------------
    decode_position_rows = 3  # mrope
    decode_suffixes = False  # prompt positions feed thinker rows without codec embeddings

    @property
    def decode_embed_dim(self) -> int:  # type: ignore[override]
        return self._text.rows.shape[1]  # the text rows gathered before the body

    def decode_graph_blocker(self) -> str | None:
        return None

    def decode_prepare(
        self,
        scheduled: list[ScheduledRequest],
        positions: np.ndarray,
        fed_frames: torch.Tensor | None = None,
    ) -> DecodeInputs | None:
        """Decode tokens of running requests whose prompt codes are marked, or of bare codec
        prompts: the same plan as forward's, its text rows gathered here (the arena may move
        between steps, so the body reads them from the graph's buffer). Anything else runs
        eagerly."""
        states = [self._states.get(e.request_id) for e in scheduled]
        for entry, state in zip(scheduled, states, strict=True):
            if entry.is_new or len(entry.token_ids) != 1:
                return None
            if state is None:  # a bare codec prompt: its text row is the arena's zero row
                continue
            if not state.prompt_codes_marked or entry.num_computed_tokens < state.prompt_len:
                return None
        step = plan_step(scheduled, states, self._text.start, self._seen.slot)
        text, _, _, _ = self._take_step(step)
        return DecodeInputs(np.concatenate(step.positions, axis=1), text)

    def decode_forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attn: AttentionMetadata,
        embeds: torch.Tensor | None = None,
    ) -> ModelOutputs:
        """embeds: the text rows; a decode token always adds its codec id's embedding."""
        if embeds is None:
            raise ValueError("the talker's decode body needs its text rows (embeds)")
        codec = self.talker.get_input_embeddings()(input_ids)
        return self._body(embeds + codec, positions, attn)

    def sample_codes(
        self,
        hidden_states: torch.Tensor,
        token_ids: torch.Tensor,
        request_ids: list[str],
        params: list[SamplingParams],
        num_output_tokens: list[int],
    ) -> torch.Tensor | None:
        """One code per step; the sampled codes go into their requests' seen rows here."""
        if self._penalty is not None and len(self._sample_ids) == token_ids.shape[0]:
            self._seen.mark_sampled(self._penalty[0], token_ids)
        return None

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        logits = self.talker.codec_head(hidden_states).float()
        logits[:, self.codec_bos] = float("-inf")  # generate's suppress_tokens=[codec bos]
        if self._penalty is None or len(self._sample_ids) != logits.shape[0]:
            return logits  # no penalty, or not the rows of the last forward
        slots, groups, penalties = self._penalty
        return self._seen.penalize(logits, slots, groups, penalties)


if TYPE_CHECKING:  # mypy checks the adapter against the contract its engine calls it by
    _CONTRACT: type[StageModel] = OmniTalkerAdapter
