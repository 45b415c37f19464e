"""Input processors of the Qwen3-Omni pipeline: thinker -> talker -> code2wav.

They move data; the transformers arithmetic on it is in the adapters (talker_inputs.py,
code2wav.py). Token ids come from the prompt's extras["token_layout"] (written by the prompt
processor from the checkpoint's config), so these run anywhere without the checkpoint.

qwen3_thinker_to_talker -> talker (`qwen3_omni_moe_talker`), extras:
    user_rows         [U, D]  per user-turn thinker position (generate's user mask: the token
                              after the last <|im_start|> at or before it is `user`): the
                              thinker's accept_hidden_states row at image/audio/video tokens,
                              its inputs_embeds row elsewhere
    user_is_mm        [U]     which rows are multimodal
    assistant_rows    [3 + G - 1, D]  inputs_embeds from the last "<|im_start|>assistant" on
    talker_input_ids  user ids + 9 tts_pad ids (the talker's rope index input, as generate's)
    speaker, repetition_penalty (1.05, transformers' default), and the thinker's
    image_grid_thw / audio_feature_lengths for the rope index
    silent            True when the thinker gave fewer than 2 tokens: nothing to speak (generate
                      crashes there); the talker emits codec EOS at once, code2wav no audio.
Prompt ids (prefix-cache keys, one per talker position): the user ids, then the thinker ids of
"<|im_start|>assistant\\n", 3 tts_pad, a speaker key, tts_pad, the first reply token. Text rows
depend on their token id only; a multimodal row depends on the thinker context before it, so each
user-part item gets a MultiModalInput whose identifier hashes that context (ids and every item
identifier up to its end). Generated positions also add residual codes, which sampling may vary:
the generation key is unique to the request (generated blocks serve only its own resume).

talker_to_code2wav -> code2wav: extras["codes"] = the talker's tensors["codes"] without its last
row (generate never decodes the last frame: codec EOS, or the frame cut by max tokens).

Streaming (stage config `stream.enabled`; how each edge streams: family.py). The talker starts
once the thinker has 2 tokens: its prompt needs the thinker's prompt rows and g_0's embedding row
(row P, computed when g_0 is fed); thinker_delta passes each later embedding-layer row on (the
reply is text: the talker reads no other layer of it), and decode position P + j runs once
trailing row j has come (talker_inputs.py). code2wav starts once the talker has 2 frames: the
edge holds the talker's latest frame back (EdgeStreaming.held_back 1), since whether a frame is
decoded depends on whether another follows it; talker_delta passes the rest on with every code
group (the talker's updates carry them, StageUpdate.new_codes).
"""

from __future__ import annotations

import hashlib
import uuid
from typing import Any

import numpy as np
import torch

from omni.core.request import MultiModalInput
from omni.messages import InputDelta, PromptInput, StageInput, StageResult
from stages.qwen2_5_omni.input_processors import _mm_extras, _only
from stages.qwen3_omni_moe.talker_inputs import speaker_key

DEFAULT_SPEAKER = "Ethan"  # transformers' generate default
REPETITION_PENALTY = 1.05  # generate's talker_repetition_penalty


def user_positions(ids: np.ndarray, layout: dict[str, Any]) -> np.ndarray:
    """generate's user mask: positions whose last <|im_start|> (at or before) opens a user turn."""
    positions = np.arange(len(ids))
    starts = np.where(ids == layout["im_start"], positions, -1)
    previous = np.clip(np.maximum.accumulate(starts), 0, None)
    roles = ids[np.minimum(previous + 1, len(ids) - 1)]
    return positions[roles == layout["user"]]


def _assistant_start(ids: np.ndarray, layout: dict[str, Any]) -> int:
    pairs = np.nonzero((ids[:-1] == layout["im_start"]) & (ids[1:] == layout["assistant"]))[0]
    if not len(pairs):
        raise ValueError("the thinker prompt has no '<|im_start|>assistant' turn")
    return int(pairs[-1])


def thinker_to_talker(upstream: dict[str, StageResult], request: PromptInput) -> StageInput:
    thinker = _only(upstream, "qwen3_thinker_to_talker")
    extras = request.extras or {}
    layout = extras.get("token_layout")
    if layout is None:
        raise ValueError("prompt extras lack 'token_layout' (the Qwen3-Omni prompt processor)")
    speaker = str(extras.get("speaker", DEFAULT_SPEAKER))
    prompt, output = list(thinker.prompt_token_ids), list(thinker.token_ids)
    if len(output) < 2:  # no reply token is ever spoken (the last one never is)
        return StageInput(request.request_id, [layout["tts_pad"]],
                          cache_salt=request.cache_salt, generation_key=uuid.uuid4().hex,
                          extras={"silent": True, "speaker": speaker})  # fmt: skip
    for key in ("inputs_embeds", "accept_hidden_states"):
        if key not in thinker.tensors:
            raise ValueError(f"thinker result lacks tensors[{key!r}]")
    ids = np.asarray(prompt + output, dtype=np.int64)
    # torch, not numpy: a GPU thinker's rows are bfloat16, which numpy has no type for.
    embeds = torch.as_tensor(thinker.tensors["inputs_embeds"])
    hidden = torch.as_tensor(thinker.tensors["accept_hidden_states"])
    user = user_positions(ids[: len(prompt)], layout)
    is_mm = np.isin(ids[user], layout["multimodal"])
    at = torch.from_numpy(user)
    rows = torch.where(torch.from_numpy(is_mm)[:, None], hidden[at], embeds[at])
    start = _assistant_start(ids[: len(prompt)], layout)
    pad = layout["tts_pad"]
    keys = [*ids[start : start + 3].tolist(), pad, pad, pad, speaker_key(speaker.lower()), pad,
            output[0]]  # fmt: skip
    user_ids = ids[user].tolist()
    return StageInput(
        request_id=request.request_id,
        prompt_token_ids=user_ids + keys,
        mm_inputs=_user_items(request, prompt, user),
        cache_salt=request.cache_salt,
        generation_key=uuid.uuid4().hex,
        extras={
            "user_rows": rows,
            "user_is_mm": is_mm,
            "assistant_rows": embeds[start:],
            "talker_input_ids": user_ids + [pad] * 9,
            "thinker_finished": thinker.finished,
            "speaker": speaker,
            "repetition_penalty": float(
                extras.get("talker_repetition_penalty", REPETITION_PENALTY)
            ),
            **_mm_extras(request),
        },
    )


def thinker_delta(piece: StageResult) -> InputDelta:
    """The thinker's next reply rows for a streaming talker request: their embedding-layer rows
    (the trailing text rows) only."""
    rows = piece.tensors.get("inputs_embeds")
    return InputDelta(
        piece.request_id,
        extras={} if rows is None else {"reply_rows": rows},
        finished=piece.finished,
    )


def _user_items(
    request: PromptInput, prompt: list[int], user: np.ndarray
) -> tuple[MultiModalInput, ...]:
    """Each thinker item inside the user part, at its talker offset, keyed by its context."""
    where = {int(p): i for i, p in enumerate(user.tolist())}
    context = hashlib.sha256()
    items = []
    for item in sorted(request.mm_inputs, key=lambda m: m.offset):
        end = item.offset + item.length
        context.update(np.asarray(prompt[:end], np.int64).tobytes() + item.identifier.encode())
        if item.offset in where and (end - 1) in where:
            key = f"{item.identifier}:{context.copy().hexdigest()[:32]}"
            items.append(MultiModalInput(key, where[item.offset], item.length))
    return tuple(items)


def talker_to_code2wav(upstream: dict[str, StageResult], request: PromptInput) -> StageInput:
    talker = _only(upstream, "qwen3_talker_to_code2wav")
    codes = np.asarray(talker.tensors.get("codes", np.zeros((0, 0), np.int64)), np.int64)
    frames = codes[:-1] if len(codes) else codes
    return StageInput(
        request_id=request.request_id,
        prompt_token_ids=frames[:, 0].tolist() if frames.size else [],
        cache_salt=request.cache_salt,
        extras={"codes": frames},
    )


def talker_delta(piece: StageResult) -> InputDelta:
    """The talker's next frames for a streaming code2wav request (the edge held its latest one
    back: those here are all decoded), every code group in extras["codes"] [n, groups]."""
    codes = piece.tensors.get("codes")
    if not piece.token_ids:
        return InputDelta(piece.request_id, finished=piece.finished)
    frames = np.asarray(codes, np.int64)
    if frames.shape[0] != len(piece.token_ids):
        raise ValueError(f"talker piece: {len(piece.token_ids)} tokens, {len(frames)} code rows")
    return InputDelta(
        piece.request_id,
        new_token_ids=list(piece.token_ids),
        extras={"codes": frames},
        finished=piece.finished,
    )
