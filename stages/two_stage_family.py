"""The generic two-stage example: causal LM A's hidden states become causal LM B's prompt embeds
(stage_configs/tiny_two_stage.yaml)."""

from omni.family import AdapterSpec, EdgeSpec, ModelFamily

FAMILY = ModelFamily(
    name="two_stage",
    adapters=(
        AdapterSpec("embeds_lm", "stages.two_stage:EmbedsLMAdapter", requires_causal_lm=True),
    ),
    edges=(EdgeSpec("hidden_to_embeds", "stages.two_stage:hidden_to_embeds"),),
)
