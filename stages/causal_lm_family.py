"""The causal-LM family: any transformers *ForCausalLM checkpoint as one text stage."""

from omni.family import AdapterSpec, ModelFamily

FAMILY = ModelFamily(
    name="causal_lm",
    adapters=(
        AdapterSpec("causal_lm", "stages.causal_lm:CausalLMAdapter", requires_causal_lm=True),
    ),
    # No model_types: it claims no checkpoint, it is the fallback (config_for_model's one-stage
    # pipeline) for every model_type no family claims. No prompt_processor: text prompts.
)
