"""Adapter for any transformers causal LM (Qwen2, Llama, ...) on omni's paged attention."""

from __future__ import annotations

import importlib.util
import logging
from typing import TYPE_CHECKING, Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.utils import logging as hf_logging

from omni.runtime.attention import ATTENTION_NAME, AttentionMetadata, register_paged_attention
from omni.runtime.stage_model import ModelInputs, ModelOutputs, StageModel, StageModelBase

logger = logging.getLogger(__name__)


def load_kwargs(device: torch.device) -> dict[str, Any]:
    """from_pretrained arguments that load the weights straight onto a GPU (no CPU copy first)
    when accelerate is installed (transformers needs it for device_map); none for the CPU, where
    loading stays as it always was, or without accelerate: the weights then load on the CPU and
    the adapter's `.to(device)` moves them."""
    if device.type == "cpu":
        return {}
    if importlib.util.find_spec("accelerate") is None:  # an optional extra (`real`)
        logger.info("accelerate is not installed: loading on the CPU, then moving to %s", device)
        return {}
    return {"device_map": str(device)}


class CausalLMAdapter(StageModelBase):
    decode_ids_on_device = True  # decode_prepare reads positions only

    def __init__(
        self,
        model_dir: str,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        register_paged_attention()
        hf_logging.disable_progress_bar()  # a serving framework logs its own progress
        self.device = torch.device(device)
        config = AutoConfig.from_pretrained(model_dir)
        self.model = (
            AutoModelForCausalLM.from_pretrained(
                model_dir,
                dtype=dtype,
                attn_implementation=ATTENTION_NAME,
                **load_kwargs(self.device),
            )
            .to(self.device)
            .eval()
        )
        self.dtype = dtype
        self.num_layers = config.num_hidden_layers
        self.num_kv_heads = (
            getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        )
        self.head_dim = (
            getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        )
        self.hidden_size = config.hidden_size
        self.vocab_size = config.vocab_size
        eos = getattr(self.model.generation_config, "eos_token_id", None) or config.eos_token_id
        self.eos_token_id = eos[0] if isinstance(eos, list) else eos

    def forward(self, inputs: ModelInputs) -> ModelOutputs:
        # Any packed batch runs the same body as a padded decode step.
        return self.decode_forward(inputs.input_ids, inputs.positions.unsqueeze(0), inputs.attn)

    def decode_forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attn: AttentionMetadata,
        embeds: torch.Tensor | None = None,
    ) -> ModelOutputs:
        out = self.model.model(
            input_ids=input_ids.unsqueeze(0),
            position_ids=positions,
            use_cache=False,
            omni_attn=attn,
        )
        return ModelOutputs(hidden_states=out.last_hidden_state[0])

    def decode_graph_blocker(self) -> str | None:
        """Dynamic rope rescales its table from the step's largest position (a host read), and
        a sliding window makes the attention hook read the longest context: neither replays."""
        config = self.model.config
        rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None)
        rope_type = str((rope or {}).get("rope_type", (rope or {}).get("type", "default")))
        if "dynamic" in rope_type:
            return f"rope type {rope_type!r} rescales per step"
        windows = [getattr(m, "sliding_window", None) for m in self.model.modules()]
        if any(w is not None for w in windows):
            return "sliding-window attention"
        return None

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.model.lm_head(hidden_states)


if TYPE_CHECKING:  # mypy checks the adapter against the contract its engine calls it by
    _CONTRACT: type[StageModel] = CausalLMAdapter
