"""What the Qwen3-Omni talker feeds at each position of one request, as transformers' generate
builds it (`Qwen3OmniMoeForConditionalGeneration.generate`, `_get_talker_user_parts`,
`_get_talker_assistant_parts`, the talker's `prepare_inputs_for_generation`).

Prompt (U + 9 positions): the user turns' thinker rows, projected (`hidden_projection` of the
`accept_hidden_layer` state at image/audio/video tokens, `text_projection` of the embedding-layer
row elsewhere); then nine assistant positions: text_projection of the thinker's
`<|im_start|>assistant\\n`, four tts_pad, tts_bos, and the first reply token, plus the codec
embeddings of [-, -, -, nothink, think_bos, think_eos, speaker, codec_pad, codec_bos].

Decode position P + j (feeding frame j: layer-0 code c0 and residual codes c1..c{G-1}):
    codec_embedding(c0) + sum_g predictor.codec_embedding[g - 1](c_g) + trailing(j)
where trailing(j) is text_projection of reply token j + 1 while there is one, then tts_eos, then
tts_pad: the thinker's last token is never spoken, as in generate.

Streaming (the thinker still generating: extras "thinker_finished" False): the state starts with
the trailing rows known so far and `extend` appends the rest as the thinker's embedding rows
arrive (then tts_eos once it has finished), so decode position P + j waits for trailing(j)
instead of guessing it (`input_limit`). Rows are projected at least MIN_PROJECTED_ROWS at a time
(padded with zero rows): CPU sgemm with one thread gives a row the same bits in any product of 4
or more rows, not in smaller ones (measured), and the unstreamed path projects the whole assistant
segment (at least 4 rows) in one product, so both paths feed the same bits.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from stages.qwen3_omni_moe.rope import rope_index

MIN_PROJECTED_ROWS = 4  # a row's text_projection bits are the same in any product of >= 4 rows


def speaker_key(name: str) -> int:
    """The talker prompt id standing for a speaker (prompt ids only key the prefix cache)."""
    return zlib.crc32(f"qwen3_omni_moe speaker {name}".encode())


@dataclass
class TalkerRequestState:
    prompt_embeds: torch.Tensor  # [P, H] on the device
    trailing: torch.Tensor  # [T, H] on the device
    pad: torch.Tensor  # [H]: text_projection(tts_pad), the text row past the trailing rows
    positions: torch.Tensor | None  # [3, P] on the host (None: plain positions)
    delta: int  # decode position t feeds rope position t + delta
    repetition_penalty: float
    silent: bool  # the thinker gave no reply to speak: the first code is codec EOS
    eos: torch.Tensor | None = None  # [H] text_projection(tts_eos), until the thinker finished

    @property
    def prompt_len(self) -> int:
        return self.prompt_embeds.shape[0]

    @property
    def input_limit(self) -> int | None:
        """Positions whose inputs are known: all once the thinker has finished (eos is None);
        before, the prompt and one decode position per trailing row that has come."""
        return None if self.eos is None else self.prompt_len + self.trailing.shape[0]

    def extend(self, talker: Any, rows: torch.Tensor | None, finished: bool) -> None:
        """The thinker's next embedding-layer rows [n, D] (its next reply tokens), and whether
        it has finished (tts_eos then follows them)."""
        if self.eos is None:
            raise ValueError("the talker's thinker input is already complete")
        parts = [self.trailing]
        if rows is not None and len(rows):
            parts.append(project(talker, rows))
        if finished:
            parts.append(self.eos[None])
            self.eos = None
        self.trailing = torch.cat(parts)


def _tensor(value: Any, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """A tensor, array or list as a tensor (never through numpy: bfloat16 has no numpy type)."""
    return torch.as_tensor(value).to(device=device, dtype=dtype)


def project(talker: Any, rows: Any) -> torch.Tensor:
    """text_projection of thinker rows [n, D], in a product of at least MIN_PROJECTED_ROWS rows."""
    param = talker.codec_head.weight
    rows = _tensor(rows, param.device, param.dtype)
    num = rows.shape[0]
    if num < MIN_PROJECTED_ROWS:
        rows = torch.cat([rows, rows.new_zeros(MIN_PROJECTED_ROWS - num, rows.shape[1])])
    with torch.no_grad():
        return talker.text_projection(rows[None])[0, :num]


def build_state(
    extras: Mapping[str, Any],
    talker: Any,
    tts_rows: Mapping[str, torch.Tensor],
    speaker_ids: Mapping[str, int],
) -> TalkerRequestState:
    """One request's inputs from its extras (input_processors.thinker_to_talker), on the talker's
    device. tts_rows: the thinker embedding rows of tts_bos / tts_eos / tts_pad."""
    config = talker.config
    param = talker.codec_head.weight
    device, dtype = param.device, param.dtype
    penalty = float(extras.get("repetition_penalty", 1.05))
    with torch.no_grad():
        bos, eos, pad = talker.text_projection(
            torch.stack([tts_rows["tts_bos"], tts_rows["tts_eos"], tts_rows["tts_pad"]])
            .to(device=device, dtype=dtype)
            .unsqueeze(0)
        )[0]
        if extras.get("silent"):
            return TalkerRequestState(pad[None], eos[None], pad, None, 0, penalty, True)
        user = _tensor(extras["user_rows"], device, dtype)
        is_mm = torch.as_tensor(np.asarray(extras["user_is_mm"], dtype=np.bool_)).to(device)
        user_part = torch.empty(user.shape[0], config.text_config.hidden_size, device=device,
                                dtype=dtype)  # fmt: skip
        if bool(is_mm.any()):
            user_part[is_mm] = talker.hidden_projection(user[is_mm])
        user_part[~is_mm] = talker.text_projection(user[~is_mm])
        reply = project(talker, extras["assistant_rows"])
        text = torch.cat([reply[:3], pad.expand(4, -1), bos[None], reply[3:4]])
        speaker = speaker_ids[extras["speaker"]]
        codec_ids = [config.codec_nothink_id, config.codec_think_bos_id, config.codec_think_eos_id,
                     speaker, config.codec_pad_id, config.codec_bos_id]  # fmt: skip
        codec = talker.get_input_embeddings()(torch.tensor(codec_ids, device=device))
        codec = torch.cat([torch.zeros(3, codec.shape[1], device=device, dtype=dtype), codec])
        assistant = text + codec
        finished = bool(extras.get("thinker_finished", True))
        trailing = torch.cat([reply[4:], eos[None]]) if finished else reply[4:]
    positions, delta = None, 0
    if any(extras.get(k) is not None for k in ("image_grid_thw", "audio_feature_lengths")):
        positions, delta = rope_index(talker, extras["talker_input_ids"], extras)
    prompt = torch.cat([user_part, assistant])
    return TalkerRequestState(prompt, trailing, pad, positions, delta, penalty, False,
                              None if finished else eos)  # fmt: skip


def check_extras(extras: Mapping[str, Any]) -> None:
    """ValueError naming the first missing or malformed input."""
    if extras.get("silent"):
        return
    for key in ("user_rows", "user_is_mm", "assistant_rows", "talker_input_ids", "speaker"):
        if key not in extras:
            raise ValueError(
                f"talker extras lack {key!r} (input processor qwen3_thinker_to_talker)"
            )
    rows, mask = extras["user_rows"], extras["user_is_mm"]
    if len(rows) != len(mask) or len(rows) + 9 != len(extras["talker_input_ids"]):
        raise ValueError("talker extras: user_rows, user_is_mm and talker_input_ids disagree")
    if len(extras["assistant_rows"]) < 4:
        raise ValueError("talker extras: assistant_rows needs the 3 assistant tokens and 1 reply")
