"""Input processors of the Qwen2.5-Omni pipeline: thinker -> talker -> token2wav.

They only move data: the exact transformers arithmetic on it lives in the adapters
(talker_inputs.py, token2wav.py), which know the checkpoint (token ids, speakers). Both
processors are torch-light and run wherever the consuming stage runs.

Extras contract
---------------
thinker_to_talker -> talker (`qwen2_5_omni_talker`):
    thinker_prompt_ids   list[int]   the thinker's P prompt ids
    thinker_output_ids   list[int]   its G generated ids (G >= 2)
    thinker_hidden       [P+G-1, D]  thinker result tensors["hidden_states"] (last layer, normed)
    thinker_embeds       [P+G-1, D]  thinker result tensors["inputs_embeds"] (layer 0, mm merged)
    speaker              str         default "Chelsie", as transformers' generate
    mode                 str         "masked" (default) | "unmasked" (see talker_inputs.py)
    image_grid_thw, video_grid_thw, audio_feature_lengths, video_second_per_grid,
    use_audio_in_video   the thinker's multimodal grid/length inputs, for the talker's mrope
talker_to_token2wav -> token2wav (`qwen2_5_omni_token2wav`):
    prompt_token_ids     the codec ids before the first codec EOS (8292 pad / 8294 end)
    speaker              str         selects cond / ref_mel in spk_dict.pt

Why the talker's prompt ids are a sound prefix-cache key
--------------------------------------------------------
The talker's prompt ids are thinker prompt ids + [speaker key] + [g_0], position-aligned with the
talker's P + 2 prompt positions, with the thinker's multimodal ranges (mm_inputs: content hashes)
and cache_salt passed through. Talker input t < P depends only on the thinker's hidden state and
embedding at t; the thinker is causal and deterministic, so those depend only on thinker tokens
0..t and on the multimodal items overlapping them, all of which the chained block hash covers.
Position P depends on the speaker (its key), P + 1 on the prompt and g_0. So two requests share a
talker prompt block only if every input row in it (and before it) is the same.
Decode positions also add a reply row (from g_1, g_2, ...): the request's generation_key, a hash
of the whole thinker reply, keys every block holding a generated position, so generated blocks
(looked up when a preempted request resumes) are shared only between equal replies. A streaming
request starts before the reply is known: its key is unique to the request, so its generated
blocks serve only its own resume (its prompt blocks are shared as always).

Streaming (stage config `stream.enabled`; how each edge streams: family.py): thinker_to_talker
starts the talker once the thinker has 2 tokens (rows 0..P: the talker's whole prompt); each later
piece of the thinker becomes an InputDelta of new rows (thinker_delta). talker_to_token2wav starts
token2wav on the first codes; talker_delta passes further codes on, up to the first codec EOS.
"""

from __future__ import annotations

import hashlib
import struct
import uuid

from omni.messages import InputDelta, PromptInput, StageInput, StageResult
from stages.qwen2_5_omni.talker import speaker_key

DEFAULT_SPEAKER = "Chelsie"  # transformers' generate default
CODEC_EOS = (8292, 8294)  # generate's talker_eos_token_id (codec pad, codec end)
_MM_ALIASES = {
    "image_grid_thw": ("image_grid_thw",),
    "video_grid_thw": ("video_grid_thw",),
    "audio_feature_lengths": ("audio_feature_lengths",),
    "video_second_per_grid": ("video_second_per_grid", "second_per_grid_ts"),
    "use_audio_in_video": ("use_audio_in_video",),
}


def _only(upstream: dict[str, StageResult], what: str) -> StageResult:
    if len(upstream) != 1:
        raise ValueError(f"{what} expects exactly one upstream stage, got {sorted(upstream)}")
    result = next(iter(upstream.values()))
    if result.error is not None:
        raise ValueError(f"upstream stage {result.stage!r} failed: {result.error}")
    return result


def _mm_extras(request: PromptInput) -> dict:
    """The thinker's grid / audio-length inputs, which the talker's mrope positions need."""
    out = {}
    src = request.extras or {}
    for key, names in _MM_ALIASES.items():
        for name in names:
            if src.get(name) is not None:
                out[key] = src[name]
                break
    return out


def thinker_to_talker(
    upstream: dict[str, StageResult], request: PromptInput, *, mode: str = "masked"
) -> StageInput:
    thinker = _only(upstream, "thinker_to_talker")
    prompt, output = list(thinker.prompt_token_ids), list(thinker.token_ids)
    if len(output) < 2:
        raise ValueError(
            f"the talker needs at least 2 thinker tokens, the thinker gave {len(output)}"
        )
    for key in ("hidden_states", "inputs_embeds"):
        if key not in thinker.tensors:
            raise ValueError(f"thinker result lacks tensors[{key!r}]")
    speaker = (request.extras or {}).get("speaker", DEFAULT_SPEAKER)
    salt = request.cache_salt
    if mode != "masked":  # a different input construction must never share KV blocks
        salt = f"{salt or ''}|talker:{mode}"
    return StageInput(
        request_id=request.request_id,
        prompt_token_ids=prompt + [speaker_key(speaker), output[0]],
        mm_inputs=tuple(request.mm_inputs),
        cache_salt=salt,
        generation_key=_reply_key(output) if thinker.finished else f"stream:{uuid.uuid4().hex}",
        extras={
            "thinker_prompt_ids": prompt,
            "thinker_output_ids": output,
            "thinker_hidden": thinker.tensors["hidden_states"],
            "thinker_embeds": thinker.tensors["inputs_embeds"],
            "thinker_finished": thinker.finished,
            "speaker": speaker,
            "mode": mode,
            **_mm_extras(request),
        },
    )


def thinker_delta(piece: StageResult) -> InputDelta:
    """The thinker's next tokens and rows for a streaming talker request."""
    hidden, embeds = piece.tensors.get("hidden_states"), piece.tensors.get("inputs_embeds")
    if (hidden is None) != (embeds is None) or (
        hidden is not None and embeds is not None and hidden.shape[0] != embeds.shape[0]
    ):
        raise ValueError("thinker piece: hidden_states and inputs_embeds rows do not match")
    rows = {} if hidden is None else {"thinker_hidden": hidden, "thinker_embeds": embeds}
    return InputDelta(
        piece.request_id,
        extras={"thinker_output_ids": list(piece.token_ids), **rows},
        finished=piece.finished,
    )


def _reply_key(output: list[int]) -> str:
    return hashlib.sha256(struct.pack(f"<{len(output)}I", *output)).hexdigest()[:32]


def thinker_to_talker_unmasked(
    upstream: dict[str, StageResult], request: PromptInput
) -> StageInput:
    """As transformers 5.23's generate for one unpadded request: plain positions, no codec
    pad/bos embeddings (it drops the all-ones attention mask; see talker_inputs.py)."""
    return thinker_to_talker(upstream, request, mode="unmasked")


def _before_eos(codes: list[int]) -> list[int]:
    """generate decodes the codes before the first codec EOS (code_length)."""
    for i, code in enumerate(codes):
        if code in CODEC_EOS:
            return codes[:i]
    return list(codes)


def talker_to_token2wav(upstream: dict[str, StageResult], request: PromptInput) -> StageInput:
    talker = _only(upstream, "talker_to_token2wav")
    codes = _before_eos(list(talker.token_ids))
    # No codes (the talker's first token was EOS): an empty waveform, so the text still arrives.
    return StageInput(
        request_id=request.request_id,
        prompt_token_ids=codes,
        cache_salt=request.cache_salt,
        extras={"speaker": (request.extras or {}).get("speaker", DEFAULT_SPEAKER)},
    )


def talker_delta(piece: StageResult) -> InputDelta:
    """The talker's next codes for a streaming token2wav request. The talker stops at its first
    codec EOS, so a piece holds at most one EOS, as its last token."""
    return InputDelta(
        piece.request_id, new_token_ids=_before_eos(list(piece.token_ids)), finished=piece.finished
    )
