"""Per-request talker inputs: the embeddings and mrope positions transformers would feed.

Qwen2_5OmniForConditionalGeneration.generate (transformers 5.23) builds the talker's input from
the thinker's result; talker position t (0-based) gets, before `thinker_to_talker_proj`:

    t < P        hidden[t] + embeds[t]     thinker last hidden state + its layer-0 embedding,
                                           the embedding zeroed at image/audio/video tokens
    t = P        embed_thinker(speaker bos) (+ embed_codec(codec pad)   in "masked" mode)
    t = P + 1    hidden[P] + embeds[P]      (+ embed_codec(codec bos)   in "masked" mode)
    t = P + 2 + k  embed_codec(c_k) + reply[min(k, G - 1)]    (decode step k feeds codec c_k)

with P thinker prompt tokens, G thinker output tokens g_0..g_{G-1}, and the reply stream
reply = [hidden[P+j] + embeds[P+j] for j = 1..G-2] + [embed_thinker(tts_eos), embed_thinker(tts_pad)]
(the last row repeats forever). A streaming request (its thinker still generating: extras
"thinker_finished" False) starts with the rows computed so far and gets the rest through
`TalkerRequestState.extend`; the tts_eos/tts_pad rows are appended once the thinker has finished,
so decode step k waits until reply[k] is known instead of guessing it. transformers' per-row EOS
rewrite of the reply stream only matters for rows of a padded batch that stopped early; a single
sequence stops at its first EOS, where the rewrite is the identity, so it is not needed here.

Two modes, because transformers' talker forward takes two paths:
- "masked" (default; what the talker forward does whenever it receives an attention mask, as in
  transformers 4.x and in padded batches): 3-row mrope positions from `get_rope_index` over the
  text ids (prompt + speaker bos + g_0, with the thinker's image/audio grids), then
  position = t + rope_delta in decode, and the codec pad/bos embeddings added at P and P + 1.
- "unmasked": transformers 5.23's `generate` drops an all-ones attention mask before the first
  forward, so an unpadded single request takes the other path: plain positions t on all three
  rows and no codec pad/bos embeddings. Kept so that tests can match that `generate` exactly.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

MODES = ("masked", "unmasked")
MM_KEYS = (
    "image_grid_thw",
    "video_grid_thw",
    "audio_feature_lengths",
    "video_second_per_grid",
    "use_audio_in_video",
)


@dataclass
class TalkerRequestState:
    """What forward() needs, besides the request's text rows (kept by the adapter in its row
    arena), to build any fed range of one request. Host data only."""

    num_rows: int  # text rows known: P + 2 + G once the thinker has finished, fewer before
    prompt_len: int  # P + 2: positions before the first decode step
    codec_prefix: tuple[int, int] | None  # codec ids added at P and P + 1 ("masked" mode)
    mrope: np.ndarray | None  # [3, P + 2] prompt positions ("masked" mode)
    rope_delta: int  # decode position = t + rope_delta
    prompt_codec_ids: tuple[int, ...] = ()  # codec ids the penalty sees before any step
    repetition_penalty: float = 1.05
    finished: bool = True  # the thinker has finished: text ends with tts_eos, tts_pad
    tail: tuple[torch.Tensor, torch.Tensor] | None = None  # tts_eos, tts_pad rows, until finished
    prompt_codes_marked: bool = False  # prompt_codec_ids are in the adapter's seen-mask

    @property
    def input_limit(self) -> int | None:
        """Positions whose inputs are known: all once the thinker has finished."""
        return None if self.finished else self.num_rows

    def extend(
        self, hidden: torch.Tensor | None, embeds: torch.Tensor | None, finished: bool
    ) -> list[torch.Tensor]:
        """The thinker's next reply rows (generated positions: no multimodal zeroing): the text
        rows to append, in order, in the thinker's dtype (the arena converts them)."""
        if self.finished:
            raise ValueError("the talker's thinker input is already complete")
        rows = []
        if hidden is not None and embeds is not None and hidden.shape[0]:
            rows.append(hidden + embeds)  # as build_state: summed in the thinker's dtype
        if finished:
            assert self.tail is not None
            rows.append(torch.stack(self.tail))
            self.finished, self.tail = True, None
        self.num_rows += sum(r.shape[0] for r in rows)
        return rows

    def positions(self, first: int, num: int) -> np.ndarray:
        """[3, num] mrope positions of talker positions first .. first + num - 1."""
        t = np.arange(first, first + num, dtype=np.int64)
        if self.mrope is None:
            return np.tile(t, (3, 1))
        out = np.tile(t + self.rope_delta, (3, 1))
        num_prompt = min(max(self.prompt_len - first, 0), num)
        if num_prompt:
            out[:, :num_prompt] = self.mrope[:, first : first + num_prompt]
        return out


def check_extras(extras: Mapping[str, Any]) -> None:
    """ValueError unless `extras` holds a well-formed thinker_to_talker payload."""
    for key in ("thinker_prompt_ids", "thinker_output_ids", "thinker_hidden", "thinker_embeds"):
        if key not in extras:
            raise ValueError(f"talker extras lack {key!r} (use input processor thinker_to_talker)")
    num_prompt, num_out = len(extras["thinker_prompt_ids"]), len(extras["thinker_output_ids"])
    if num_out < 2:
        raise ValueError(f"the talker needs at least 2 thinker output tokens, got {num_out}")
    rows = num_prompt + num_out - 1
    for key in ("thinker_hidden", "thinker_embeds"):
        t = extras[key]
        if not isinstance(t, torch.Tensor) or t.dim() != 2 or t.shape[0] != rows:
            shape = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"talker extras {key!r}: expected [{rows}, D] rows, got {shape}")
    if extras.get("mode", "masked") not in MODES:
        raise ValueError(f"talker extras 'mode' must be one of {MODES}, got {extras['mode']!r}")


def build_state(
    extras: Mapping[str, Any],
    talker: torch.nn.Module,
    thinker_rows: dict[str, torch.Tensor],
    speakers: dict[str, int],
) -> tuple[TalkerRequestState, torch.Tensor]:
    """TalkerRequestState for one request and its text rows [num_rows, D_thinker] (on the host,
    in the thinker's dtype): the thinker-side vector of each talker position. `talker`: the HF
    talker (its config and get_rope_index); `thinker_rows`: thinker embedding rows "tts_eos",
    "tts_pad" and "spk:<name>"; `speakers`: name -> speaker bos token id."""
    config = talker.config
    prompt_ids = list(extras["thinker_prompt_ids"])
    out_ids = list(extras["thinker_output_ids"])
    hidden, embeds = extras["thinker_hidden"], extras["thinker_embeds"].clone()
    num_prompt = len(prompt_ids)
    speaker = extras.get("speaker", "Chelsie")
    if speaker not in speakers:
        raise ValueError(f"unknown speaker {speaker!r}; available: {sorted(speakers)}")
    # generate zeroes the multimodal positions of the layer-0 embeddings (not of the hidden states).
    mm_ids = [config.image_token_index, config.video_token_index, config.audio_token_index]
    is_mm = torch.isin(torch.tensor(prompt_ids), torch.tensor(mm_ids))
    embeds[:num_prompt][is_mm] = 0
    summed = (hidden + embeds).to(hidden.dtype)
    dim = summed.shape[1]
    finished = bool(extras.get("thinker_finished", True))
    # Reply rows: every thinker row after g_0's (row P), i.e. j = 1..G-2 once it has finished.
    tail = [thinker_rows["tts_eos"].view(1, dim), thinker_rows["tts_pad"].view(1, dim)]
    text = torch.cat(
        [
            summed[:num_prompt],
            thinker_rows[f"spk:{speaker}"].view(1, dim).to(summed.dtype),
            summed[num_prompt:],
            *([t.to(summed.dtype) for t in tail] if finished else []),
        ]
    )
    mode = extras.get("mode", "masked")
    prompt_len = num_prompt + 2
    history = {config.tts_codec_pad_token_id, config.tts_codec_start_token_id}
    if num_prompt:
        history.add(config.tts_codec_mask_token_id)  # generate's codec prompt ids: mask * P
    state = TalkerRequestState(
        num_rows=text.shape[0],
        prompt_len=prompt_len,
        codec_prefix=None,
        mrope=None,
        rope_delta=0,
        prompt_codec_ids=tuple(sorted(history)),
        repetition_penalty=float(extras.get("repetition_penalty", 1.05)),
        finished=finished,
        tail=None if finished else (tail[0][0], tail[1][0]),
    )
    if mode == "masked":
        state.codec_prefix = (config.tts_codec_pad_token_id, config.tts_codec_start_token_id)
        text_ids = torch.tensor([prompt_ids + [speakers[speaker], out_ids[0]]])
        mm = {k: extras.get(k) for k in MM_KEYS}
        pos, delta = talker.get_rope_index(
            text_ids,
            mm["image_grid_thw"],
            mm["video_grid_thw"],
            torch.ones_like(text_ids),
            bool(mm["use_audio_in_video"]),
            mm["audio_feature_lengths"],
            mm["video_second_per_grid"],
        )
        state.mrope = pos[:, 0, :].long().numpy()
        state.rope_delta = int(delta.view(-1)[0])
    return state, text
