"""Adapter `qwen2_5_omni_talker`: the Qwen2.5-Omni talker (thinker states -> codec tokens).

The talker is an ordinary causal decoder on omni's paged attention, except for its inputs: each
position's input embedding comes from the thinker (see talker_inputs.py), so forward() builds, for
any fed range [num_computed, num_computed + n) of a request, exactly what transformers feeds at
those positions, from the request's StageInput.extras (written by processors.thinker_to_talker).
That makes prefix hits, chunked prefill, decode and recompute after preemption all feed the same
embeddings and 3-row mrope positions as one uninterrupted transformers generate.

Sampling differences from a plain LM, both applied in compute_logits because they need the
request's codec history: generate suppresses the codec bos token and applies a repetition penalty
(transformers' default 1.05) over every codec id seen (the codec prompt ids and the generated ones).
"""

from __future__ import annotations

import zlib

import torch
from transformers import Qwen2_5OmniConfig
from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import (
    Qwen2_5OmniTalkerForConditionalGeneration,
)
from transformers.utils import logging as hf_logging

from omni.messages import InputDelta, StageInput
from omni.registry import register_adapter
from omni.runtime.attention import ATTENTION_NAME, register_paged_attention
from omni.runtime.stage_model import ModelInputs, ModelOutputs, StageModelBase
from stages.qwen2_5_omni.part_loader import load_part, load_rows, load_speakers
from stages.qwen2_5_omni.talker_inputs import TalkerRequestState, build_state, check_extras


def speaker_key(name: str) -> int:
    """The id standing for a speaker at position P of the talker's prompt token ids. The talker
    never embeds prompt ids (its prompt embeddings come from extras); they only key the prefix
    cache, so any stable per-speaker value works and processors need no checkpoint access."""
    return zlib.crc32(f"qwen2_5_omni speaker {name}".encode())


@register_adapter("qwen2_5_omni_talker", produces_text=False, model_types=("qwen2_5_omni",))
class OmniTalkerAdapter(StageModelBase):
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
        config = Qwen2_5OmniConfig.from_pretrained(model_dir).talker_config
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
        # then moved to the device as a whole.
        self.thinker_rows = {k: rows[i].to(dtype) for k, i in named.items()}
        self._states: dict[str, TalkerRequestState] = {}
        self._sample_ids: list[str | None] = []

    # ---- engine hooks ---------------------------------------------------------------------
    def check_inputs(self, stage_input: StageInput) -> None:
        check_extras(stage_input.extras)
        speaker = stage_input.extras.get("speaker", "Chelsie")
        if speaker not in self.speakers:
            raise ValueError(f"unknown speaker {speaker!r}; available: {sorted(self.speakers)}")
        # Built here, not in forward(): an input it trips over is then rejected alone instead of
        # failing every talker request of the step.
        state = build_state(stage_input.extras, self.talker, self.thinker_rows, self.speakers)
        self._states[stage_input.request_id] = state.to(self.device, self.dtype)

    def release(self, request_ids: list[str]) -> None:
        for rid in request_ids:
            self._states.pop(rid, None)

    def input_limit(self, request_id: str) -> int | None:
        return self._states[request_id].input_limit

    def extend_inputs(self, request_id: str, delta: InputDelta) -> int | None:
        """The thinker's next rows (processors.thinker_delta): decode steps that need them can
        run; once it has finished, every later step can."""
        state = self._states[request_id]
        extras = delta.extras
        state.extend(extras.get("thinker_hidden"), extras.get("thinker_embeds"), delta.finished)
        return state.input_limit

    # ---- model ----------------------------------------------------------------------------
    def _state(self, rid: str, extras: dict) -> TalkerRequestState | None:
        if not extras:
            return None  # warm-up or a bare codec prompt: codec embeddings at plain positions
        if rid not in self._states:
            state = build_state(extras, self.talker, self.thinker_rows, self.speakers)
            self._states[rid] = state.to(self.device, self.dtype)
        return self._states[rid]

    def forward(self, inputs: ModelInputs) -> ModelOutputs:
        embed_codec = self.talker.get_input_embeddings()
        embeds, positions = [], []
        self._sample_ids = []
        offset = 0
        for entry in inputs.scheduled:
            n = len(entry.token_ids)
            ids = inputs.input_ids[offset : offset + n]
            t = inputs.positions[offset : offset + n]
            offset += n
            state = self._state(entry.request_id, inputs.request_extras.get(entry.request_id, {}))
            self._sample_ids.append(entry.request_id if entry.sample else None)
            if state is None:
                embeds.append(embed_codec(ids))
                positions.append(t.unsqueeze(0).expand(3, -1))
                continue
            # The entry feeds positions first .. first + n - 1: which of them are decode steps
            # (and their codec ids) is known on the host, without reading the device tensors.
            first = entry.num_computed_tokens
            num_prompt = min(max(state.prompt_len - first, 0), n)  # fed prompt positions
            embeds.append(self._embeds(state, ids, t, first, num_prompt, embed_codec))
            positions.append(state.positions(t, first=first))
            state.history.update(entry.token_ids[num_prompt:])
        self._sample_ids = [rid for rid in self._sample_ids if rid is not None]
        hidden_in = self.talker.thinker_to_talker_proj(torch.cat(embeds))
        out = self.talker.model(
            inputs_embeds=hidden_in.unsqueeze(0),
            position_ids=torch.cat(positions, dim=1).unsqueeze(1),
            use_cache=False,
            omni_attn=inputs.attn,
        )
        return ModelOutputs(hidden_states=out.last_hidden_state[0])

    def _embeds(
        self, state: TalkerRequestState, ids, t, first: int, num_prompt: int, embed_codec
    ) -> torch.Tensor:
        """Input embeddings of positions t = first, first + 1, ... (ids: the fed codec ids);
        the first num_prompt of them are prompt positions, the rest decode steps."""
        text = state.text[t.clamp(max=state.text.shape[0] - 1)]
        codec = torch.zeros_like(text)
        if num_prompt < len(t):
            codec[num_prompt:] = embed_codec(ids[num_prompt:])
        if state.codec_prefix is not None:
            prefix_start = state.prompt_len - 2  # P: codec pad, P + 1: codec bos
            for where, codec_id in enumerate(state.codec_prefix, start=prefix_start):
                if first <= where < first + len(t):
                    codec_ids = torch.tensor([codec_id], device=text.device)
                    codec[where - first] = embed_codec(codec_ids)[0]
        return text + codec

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        logits = self.talker.codec_head(hidden_states).float()
        logits[:, self.codec_bos] = float("-inf")  # generate's suppress_tokens=[codec bos]
        if len(self._sample_ids) != logits.shape[0]:
            return logits  # not the rows of the last forward: no per-request history to apply
        for row, rid in enumerate(self._sample_ids):
            state = self._states.get(rid)
            if state is None or state.repetition_penalty == 1.0 or not state.history:
                continue
            seen = torch.tensor(sorted(state.history), device=logits.device)
            score = logits[row, seen]
            p = state.repetition_penalty
            logits[row, seen] = torch.where(score < 0, score * p, score / p)
        return logits
