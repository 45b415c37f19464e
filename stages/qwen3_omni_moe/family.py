"""Qwen3-Omni: thinker (MoE; text, images, audio -> text) -> talker (one codec frame per step)
-> code2wav (a 24 kHz waveform), three stages on one checkpoint (stage_configs/
qwen3_omni_moe.yaml). docs/qwen3_omni.md."""

from omni.family import AdapterSpec, EdgeSpec, ModelFamily

_PACKAGE = "stages.qwen3_omni_moe"

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
        # Streaming is the next issue: both edges need the finished upstream (stream=None).
        EdgeSpec("qwen3_thinker_to_talker", f"{_PACKAGE}.input_processors:thinker_to_talker"),
        EdgeSpec("qwen3_talker_to_code2wav", f"{_PACKAGE}.input_processors:talker_to_code2wav"),
    ),
    prompt_processor=f"{_PACKAGE}.prompt_processor:Qwen3OmniPromptProcessor",
    model_types=("qwen3_omni_moe",),
    stage_config="qwen3_omni_moe",
    sample_rate=24000,
)
