"""Qwen3-Omni: thinker (MoE; text, images, audio -> text) -> talker (one codec frame per step)
-> code2wav (a 24 kHz waveform), three stages on one checkpoint (stage_configs/
qwen3_omni_moe.yaml). docs/qwen3_omni.md."""

from omni.family import AdapterSpec, EdgeSpec, EdgeStreaming, ModelFamily

_PACKAGE = "stages.qwen3_omni_moe"
# The talker starts once the thinker has 2 tokens (its prompt ends with g_0's embedding row) and
# takes the thinker's embedding rows as they come; code2wav starts on the talker's first frame
# once a second exists: the latest frame is held back (never decoded if it is the last).
_THINKER_STREAM = EdgeStreaming(2, True, f"{_PACKAGE}.input_processors:thinker_delta")
_TALKER_STREAM = EdgeStreaming(2, False, f"{_PACKAGE}.input_processors:talker_delta", held_back=1)

FAMILY = ModelFamily(
    name="qwen3_omni_moe",
    adapters=(
        AdapterSpec(
            "qwen3_omni_moe_thinker",
            f"{_PACKAGE}.thinker:Qwen3OmniThinkerAdapter",
            # The two per-token outputs the talker reads: the embedding-layer output and the
            # hidden state of talker_config.accept_hidden_layer.
            emits=("inputs_embeds", "accept_hidden_states"),
            model_types=("qwen3_omni_moe",),
        ),
        AdapterSpec(
            "qwen3_omni_moe_talker",
            f"{_PACKAGE}.talker:Qwen3OmniTalkerAdapter",
            produces_text=False,  # token_ids are layer-0 codes; tensors["codes"] every group
            emits=(),  # the codes travel with the tokens (Request.output_codes), not as rows
            model_types=("qwen3_omni_moe",),
        ),
        AdapterSpec(
            "qwen3_omni_moe_code2wav",
            f"{_PACKAGE}.code2wav:Qwen3OmniCode2WavAdapter",
            kind="generation",  # generate_batch: [B, num_code_groups, T] in one call
            produces_text=False,
            emits=(),  # a waveform (StageResult.audio)
            model_types=("qwen3_omni_moe",),
        ),
    ),
    edges=(
        EdgeSpec(
            "qwen3_thinker_to_talker",
            f"{_PACKAGE}.input_processors:thinker_to_talker",
            _THINKER_STREAM,
        ),
        EdgeSpec(
            "qwen3_talker_to_code2wav",
            f"{_PACKAGE}.input_processors:talker_to_code2wav",
            _TALKER_STREAM,
        ),
    ),
    prompt_processor=f"{_PACKAGE}.prompt_processor:Qwen3OmniPromptProcessor",
    model_types=("qwen3_omni_moe",),
    stage_config="qwen3_omni_moe",
    sample_rate=24000,
)
