"""Adapter `qwen3_omni_moe_talker`: the Qwen3-Omni talker, one codec frame per engine step.

The talker's MoE decoder runs on omni's paged attention; its inputs are built per request from
the thinker's rows (talker_inputs.py), so prefix hits, chunked prefill, decode and recompute after
preemption feed exactly what transformers' generate feeds.

One step emits one whole frame per sampled request (the multi-code step contract,
StageModelBase.sample_codes): compute_logits gives the layer-0 code's logits from `codec_head`
(with generate's logits processing: the repetition penalty over the request's generated layer-0
codes, on the device, and the suppression of [vocab - 1024, vocab) except codec EOS); after the
sampler picks code 0, sample_codes runs the code predictor for the other num_code_groups - 1
codes, batched over every sampled row of the step (code_predictor.py).

Decode steps of running requests also have a capturable body (padded steps, CUDA graphs where
the experts run grouped, experts.py): decode_prepare builds each row's input (the fed frame's
code embeddings summed, plus its text row) and does forward's bookkeeping; decode_forward runs
the MoE decoder on those rows; greedy steps replay the code predictor too (code_predictor.py).
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING

import numpy as np
import torch
from transformers.utils import logging as hf_logging

from omni.core.sampling_params import SamplingParams
from omni.core.scheduler_output import ScheduledRequest
from omni.messages import InputDelta, StageInput
from omni.runtime.attention import ATTENTION_NAME, AttentionMetadata, register_paged_attention
from omni.runtime.host_upload import upload
from omni.runtime.sampler import Sampler
from omni.runtime.stage_model import (
    DecodeInputs,
    ModelInputs,
    ModelOutputs,
    StageModel,
    StageModelBase,
)
from stages.meta_build import build_empty
from stages.qwen2_5_omni.part_loader import load_rows
from stages.qwen2_5_omni.talker_penalty import SeenCodes
from stages.qwen3_omni_moe import experts
from stages.qwen3_omni_moe.code_predictor import CodePredictor
from stages.qwen3_omni_moe.talker_inputs import TalkerRequestState, build_state, check_extras
from stages.qwen3_omni_moe.weights import load_part

Frame = tuple[TalkerRequestState, int, tuple[int, ...], int]  # state, code 0, the rest, position
Attn = AttentionMetadata


class Qwen3OmniTalkerAdapter(StageModelBase):
    decode_ids_on_device = True  # a frame launched ahead is fed from the device (fed_frames)

    def __init__(
        self,
        model_dir: str,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import (
            Qwen3OmniMoeAudioEncoderConfig,
            Qwen3OmniMoeTalkerConfig,
        )
        from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
            Qwen3OmniMoeTalkerForConditionalGeneration,
        )

        register_paged_attention()
        hf_logging.disable_progress_bar()
        self.device = torch.device(device)
        with open(os.path.join(model_dir, "config.json")) as f:
            raw = json.load(f)
        config = Qwen3OmniMoeTalkerConfig(**raw["talker_config"])
        # transformers' talker positions an audio item by `self.config.audio_config.n_window`,
        # which a talker config lacks: generate crashes (AttributeError) on a prompt with images
        # and audio. The thinker's audio config (the tower that made those tokens) supplied here
        # is that crash fixed and nothing else (docs/qwen3_omni.md, "Images and audio").
        if not hasattr(config, "audio_config"):
            config.audio_config = Qwen3OmniMoeAudioEncoderConfig(
                **raw["thinker_config"]["audio_config"]
            )
        config.text_config._attn_implementation = ATTENTION_NAME
        # The code predictor runs whole frames with its own small cache, on sdpa as in generate.
        config.code_predictor_config._attn_implementation = "sdpa"
        # Parameters on the meta device in `dtype`, then loaded straight onto the device: no
        # float32 host copy and no random init (~13 GB, tens of seconds for the 30B-A3B talker).
        talker = build_empty(lambda: Qwen3OmniMoeTalkerForConditionalGeneration(config), dtype)
        load_part(talker, model_dir, "talker.", self.device)  # per-expert tensors fused
        self.talker = talker.eval()
        text = config.text_config
        sizes = text.hidden_size, text.moe_intermediate_size, text.shared_expert_intermediate_size
        experts.install(talker, experts.choose(self.device, dtype, *sizes))  # no sync per layer
        self.config = config
        self.dtype = dtype
        self.num_layers = text.num_hidden_layers
        self.num_kv_heads = text.num_key_value_heads
        self.head_dim = (
            getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
        )
        self.hidden_size = text.hidden_size
        self.vocab_size = 2**32  # prompt ids are thinker ids and keys, hashed only
        self.eos_token_id = config.codec_eos_token_id
        self.num_code_groups = config.num_code_groups
        self.speakers = {str(k).lower(): int(v) for k, v in (config.speaker_id or {}).items()}
        if not self.speakers:
            raise ValueError(f"{model_dir!r}: talker_config.speaker_id names no speaker")
        names = {k: raw[f"{k}_token_id"] for k in ("tts_bos", "tts_eos", "tts_pad")}
        rows = load_rows(model_dir, "thinker.model.embed_tokens.weight",
                         list(names.values()))  # fmt: skip
        self.tts_rows = {k: rows[i] for k, i in names.items()}
        # generate's suppress_tokens: [vocab - 1024, vocab) but codec EOS.
        suppress = torch.zeros(text.vocab_size, dtype=torch.bool)
        suppress[max(text.vocab_size - 1024, 0) :] = True
        suppress[self.eos_token_id] = False
        self._suppress = suppress.to(self.device)
        self._seen = SeenCodes(text.vocab_size, self.device)
        self._predictor = CodePredictor(talker, Sampler(0, device=self.device))
        self._states: dict[str, TalkerRequestState] = {}
        self._sample_ids: list[str] = []

    # ---- engine hooks ---------------------------------------------------------------------------
    def check_inputs(self, stage_input: StageInput) -> None:
        extras = stage_input.extras
        check_extras(extras)
        speaker = str(extras.get("speaker", "")).lower()
        if not extras.get("silent") and speaker not in self.speakers:
            raise ValueError(f"unknown speaker {speaker!r}; available: {sorted(self.speakers)}")
        state = build_state({**extras, "speaker": speaker}, self.talker, self.tts_rows,
                            self.speakers)  # fmt: skip
        if state.prompt_len != len(stage_input.prompt_token_ids):
            raise ValueError(
                f"talker prompt of {len(stage_input.prompt_token_ids)} ids for "
                f"{state.prompt_len} input positions"
            )
        self.release([stage_input.request_id])
        self._states[stage_input.request_id] = state

    def release(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            self._states.pop(request_id, None)
            self._seen.release(request_id)

    def input_limit(self, request_id: str) -> int | None:
        return self._states[request_id].input_limit

    def extend_inputs(self, request_id: str, delta: InputDelta) -> int | None:
        """The thinker's next embedding-layer rows (input_processors.thinker_delta): the decode
        positions they feed can run; once it has finished, every later one can."""
        state = self._states[request_id]
        state.extend(self.talker, delta.extras.get("reply_rows"), delta.finished)
        return state.input_limit

    # ---- model ----------------------------------------------------------------------------------
    def forward(self, inputs: ModelInputs) -> ModelOutputs:
        embeds, positions, marks = [], [], []
        for entry in inputs.scheduled:
            state = self._states.get(entry.request_id)
            first, num = entry.num_computed_tokens, len(entry.token_ids)
            if state is None:  # warm-up or profiling: codec embeddings at plain positions
                ids = torch.tensor(entry.token_ids, device=self.device)
                embeds.append(self.talker.get_input_embeddings()(ids))
                positions.append(torch.arange(first, first + num).expand(3, -1))
                continue
            num_prompt = min(max(state.prompt_len - first, 0), num)
            if num_prompt:
                embeds.append(state.prompt_embeds[first : first + num_prompt])
            if num > num_prompt:
                ids = entry.token_ids[num_prompt:]
                at = range(first + num_prompt, first + num)
                frames = zip(ids, entry.fed_codes, at, strict=True)  # a residual row per code
                embeds.append(self._frame_inputs([(state, *frame) for frame in frames]))
                slot = self._seen.slot(entry.request_id)
                marks += [(slot, code) for code in ids]
            t = torch.arange(first, first + num)
            table = state.positions
            rows = t.expand(3, -1) + state.delta
            if table is not None and num_prompt:
                rows = rows.clone()
                rows[:, :num_prompt] = table[:, first : first + num_prompt]
            positions.append(rows)
        if marks:
            self._seen.mark(*upload([np.array(marks)], self.device)[0].unbind(1))  # slots, codes
        self._sample_ids = [e.request_id for e in inputs.scheduled if e.sample]
        rows = torch.cat(positions, dim=1).to(self.device).unsqueeze(1)  # [3, 1, T]
        return self._body(torch.cat(embeds), rows, inputs.attn)

    def _body(self, embeds: torch.Tensor, rows: torch.Tensor, attn: Attn) -> ModelOutputs:
        out = self.talker.model(inputs_embeds=embeds[None], position_ids=rows, omni_attn=attn,
                                use_cache=False)  # fmt: skip
        return ModelOutputs(hidden_states=out.last_hidden_state[0])

    def _frame_inputs(self, frames: list[Frame], codes: torch.Tensor | None = None) -> torch.Tensor:
        """Inputs of decode positions, one per frame: its codes' embeddings summed, plus its text
        row (thinker's trailing rows, then tts_pad). codes: [n, groups] if uploaded already."""
        if codes is None:
            (codes,) = upload([np.array([[c, *rest] for _, c, rest, _ in frames])], self.device)
        predictor = self.talker.code_predictor.get_input_embeddings()
        parts = [self.talker.get_input_embeddings()(codes[:, 0])]
        parts += [predictor[g - 1](codes[:, g]) for g in range(1, self.num_code_groups)]
        summed = torch.stack(parts, dim=1).sum(1)
        rows = []
        for state, _, _, position in frames:
            index = position - state.prompt_len  # the frame fed at `position`
            rows.append(state.trailing[index] if index < state.trailing.shape[0] else state.pad)
        return summed + torch.stack(rows)

    # ---- padded (CUDA-graph) decode steps -------------------------------------------------------
    decode_position_rows = 3  # mrope
    decode_suffixes = False  # prompt positions feed the thinker's rows

    @property
    def decode_embed_dim(self) -> int:  # type: ignore[override]
        return self.hidden_size  # each row's whole input, built before the body

    def decode_graph_blocker(self) -> str | None:
        return experts.blocker(self.talker.model)

    def decode_prepare(
        self,
        scheduled: list[ScheduledRequest],
        positions: np.ndarray,
        fed_frames: torch.Tensor | None = None,
    ) -> DecodeInputs | None:
        """One decode frame per running request past its prompt: forward's inputs and
        bookkeeping for those rows; anything else (prompts, warm-up rows) runs eagerly.
        fed_frames: a launched-ahead step's frames on the device (the entries hold placeholders)."""
        states = [self._states.get(e.request_id) for e in scheduled]
        frames: list[Frame] = []
        for entry, state, position in zip(scheduled, states, positions.tolist(), strict=True):
            if entry.is_new or len(entry.token_ids) != 1 or len(entry.fed_codes) != 1:
                return None
            if state is None or position < state.prompt_len:
                return None
            frames.append((state, entry.token_ids[0], entry.fed_codes[0], position))
        slots = [self._seen.slot(e.request_id) for e in scheduled]
        fed = [] if fed_frames is not None else [np.array([[c, *r] for _, c, r, _ in frames])]
        on_device, *uploaded = upload([np.array(slots), *fed], self.device)  # one copy, no wait
        codes = fed_frames if fed_frames is not None else uploaded[0]
        self._seen.mark(on_device, codes[:, 0])
        self._sample_ids = [e.request_id for e in scheduled if e.sample]
        deltas = np.array([state.delta for state, _, _, _ in frames], dtype=positions.dtype)
        rows = np.repeat((positions + deltas)[None], 3, axis=0)
        return DecodeInputs(rows, self._frame_inputs(frames, codes))

    def decode_forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attn: AttentionMetadata,
        embeds: torch.Tensor | None = None,
    ) -> ModelOutputs:
        """embeds: each row's input from decode_prepare (the ids are in it already)."""
        if embeds is None:
            raise ValueError("the talker's decode body needs its rows' inputs (embeds)")
        return self._body(embeds, positions.unsqueeze(1), attn)  # positions [3, 1, B]

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        logits = self.talker.codec_head(hidden_states).float()
        if len(self._sample_ids) != logits.shape[0]:
            return logits  # not the rows of the last forward (profiling)
        states = [self._states[r] for r in self._sample_ids]
        penalties = sorted({s.repetition_penalty for s in states if s.repetition_penalty != 1.0})
        if penalties:
            slots = [self._seen.slot(r) if s.repetition_penalty != 1.0 else 0
                     for r, s in zip(self._sample_ids, states, strict=True)]  # fmt: skip
            groups = [penalties.index(s.repetition_penalty) if s.repetition_penalty != 1.0 else 0
                      for s in states]  # fmt: skip
            (index,) = upload([np.array([slots, groups])], logits.device)  # no blocking copy
            logits = self._seen.penalize(logits, index[0], index[1], penalties)
        logits = logits.masked_fill(self._suppress, float("-inf"))
        silent = [i for i, s in enumerate(states) if s.silent]
        if silent:  # nothing to speak: the first code is codec EOS
            (rows,) = upload([np.array(silent)], logits.device)
            logits[rows] = float("-inf")
            logits[rows, self.eos_token_id] = 0.0
        return logits

    def sample_codes(
        self,
        hidden_states: torch.Tensor,
        token_ids: torch.Tensor,
        request_ids: list[str],
        params: list[SamplingParams],
        num_output_tokens: list[int],
    ) -> torch.Tensor:
        """The code predictor's residual codes of every sampled row (code_predictor.py)."""
        return self._predictor(hidden_states, token_ids, params, num_output_tokens)

    def enable_cuda_graphs(self, max_rows: int, *, required: bool = False) -> None:
        """With padded decode steps: greedy steps' code predictor as CUDA graphs too (0: none)."""
        self._predictor.enable_graphs(max_rows, required=required)


if TYPE_CHECKING:  # mypy checks the adapter against the contract its engine calls it by
    _CONTRACT: type[StageModel] = Qwen3OmniTalkerAdapter
