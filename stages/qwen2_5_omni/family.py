"""Qwen2.5-Omni: thinker (text, images, audio -> text) -> talker (codec codes) -> token2wav
(a 24 kHz waveform), three stages on one checkpoint (stage_configs/qwen2_5_omni.yaml)."""

from omni.family import AdapterSpec, EdgeSpec, EdgeStreaming, ModelFamily

_PACKAGE = "stages.qwen2_5_omni"
# The thinker streams its tokens and per-token rows to the talker once it has two tokens (the
# talker's prompt ends with the first reply token); the talker streams codes to token2wav.
_THINKER_STREAM = EdgeStreaming(2, True, f"{_PACKAGE}.input_processors:thinker_delta")
_TALKER_STREAM = EdgeStreaming(1, False, f"{_PACKAGE}.input_processors:talker_delta")

FAMILY = ModelFamily(
    name="qwen2_5_omni",
    adapters=(
        AdapterSpec(
            "qwen2_5_omni_thinker",
            f"{_PACKAGE}.thinker:OmniThinkerAdapter",
            emits=("hidden_states", "inputs_embeds"),  # both feed the talker
            model_types=("qwen2_5_omni", "qwen2_5_omni_thinker"),  # full checkpoint or thinker
        ),
        AdapterSpec(
            "qwen2_5_omni_talker",
            f"{_PACKAGE}.talker:OmniTalkerAdapter",
            produces_text=False,  # codec codes
            model_types=("qwen2_5_omni",),
        ),
        AdapterSpec(
            "qwen2_5_omni_token2wav",
            f"{_PACKAGE}.token2wav:OmniToken2WavAdapter",
            kind="generation",
            produces_text=False,
            emits=(),  # a waveform (StageResult.audio), no per-token tensors
            model_types=("qwen2_5_omni",),
        ),
    ),
    edges=(
        EdgeSpec(
            "thinker_to_talker",
            f"{_PACKAGE}.input_processors:thinker_to_talker",
            _THINKER_STREAM,
        ),
        EdgeSpec(
            "thinker_to_talker_unmasked",
            f"{_PACKAGE}.input_processors:thinker_to_talker_unmasked",
            _THINKER_STREAM,
        ),
        EdgeSpec(
            "talker_to_token2wav",
            f"{_PACKAGE}.input_processors:talker_to_token2wav",
            _TALKER_STREAM,
        ),
    ),
    prompt_processor=f"{_PACKAGE}.prompt_processor:OmniPromptProcessor",
    model_types=("qwen2_5_omni",),
    stage_config="qwen2_5_omni",
    sample_rate=24000,
)
