"""Adapter `qwen2_5_omni_token2wav`: codec codes -> waveform (DiT to mel, then BigVGAN).

A generation-stage adapter (omni/generation_engine.py): `generate(stage_input, seed)` runs one
request. It loads only the checkpoint's "token2wav." weights and spk_dict.pt, and keeps them in
float32 as transformers does (`self.token2wav.float()` in generate).

Noise and seeds: the only randomness is the DiT's initial state, drawn with torch.randn from
torch's global generator inside Qwen2_5OmniToken2WavDiTModel.sample. We call
torch.manual_seed(seed) right before each decode, inside torch.random.fork_rng() so that the
process's global RNG is left as it was. That equals transformers when the caller seeds right
before its token2wav call; in the full generate with greedy thinker and talker nothing draws from
the global RNG before token2wav, so torch.manual_seed(seed) before generate(...) matches too.
Each request is decoded on its own, as generate does, because the noise shape follows the
request's code length: batching would change the draws.
"""

from __future__ import annotations

import torch
from transformers import Qwen2_5OmniConfig
from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import Qwen2_5OmniToken2WavModel
from transformers.utils import logging as hf_logging

from omni.messages import StageInput
from omni.registry import register_adapter
from omni.runtime.stage_model import StageModelBase
from stages.qwen2_5_omni.part_loader import load_part, load_speakers

SAMPLE_RATE = 24000  # Qwen2.5-Omni's BigVGAN output rate (processors/docs: 24 kHz audio)
DEFAULT_SPEAKER = "Chelsie"
# Qwen2_5OmniToken2WavModel.forward defaults, overridable per request through extras.
ODE_DEFAULTS = {"num_steps": 10, "guidance_scale": 0.5, "sway_coefficient": -1.0}


@register_adapter(
    "qwen2_5_omni_token2wav",
    kind="generation",
    produces_text=False,
    emits=(),  # a waveform (StageResult.audio), no per-token tensors
    model_types=("qwen2_5_omni",),
)
class OmniToken2WavAdapter(StageModelBase):
    sample_rate = SAMPLE_RATE

    def __init__(self, model_dir: str, *, dtype: torch.dtype = torch.float32) -> None:
        del dtype  # token2wav always runs in float32 (as transformers forces it)
        hf_logging.disable_progress_bar()
        config = Qwen2_5OmniConfig.from_pretrained(model_dir).token2wav_config
        config._attn_implementation = "sdpa"
        self.model = Qwen2_5OmniToken2WavModel(config).float().eval()
        load_part(self.model, model_dir, "token2wav.")
        dit = config.dit_config
        self.num_embeds = dit.num_embeds
        self.max_codes = dit.max_position_embeddings // dit.repeats
        self.speakers = {
            name: (v["cond"].float(), v["ref_mel"].float())
            for name, v in load_speakers(model_dir).items()
        }

    def check_inputs(self, stage_input: StageInput) -> None:
        codes = stage_input.prompt_token_ids
        if len(codes) > self.max_codes:
            raise ValueError(
                f"{len(codes)} codec tokens exceed the DiT's limit of {self.max_codes}"
            )
        bad = [c for c in codes if not 0 <= c < self.num_embeds]
        if bad:
            raise ValueError(f"codec id {bad[0]} is outside the DiT's {self.num_embeds} embeddings")
        speaker = stage_input.extras.get("speaker", DEFAULT_SPEAKER)
        if speaker not in self.speakers:
            raise ValueError(f"unknown speaker {speaker!r}; available: {sorted(self.speakers)}")
        unknown = set(stage_input.extras) - {"speaker", *ODE_DEFAULTS}
        if unknown:
            raise ValueError(f"unknown token2wav extras {sorted(unknown)}")

    @torch.inference_mode()
    def generate(self, stage_input: StageInput, seed: int) -> torch.Tensor:
        """The 1-D float32 waveform of one request's codes."""
        if not stage_input.prompt_token_ids:  # the talker stopped at once: nothing to say
            return torch.zeros(0)
        extras = stage_input.extras
        cond, ref_mel = self.speakers[extras.get("speaker", DEFAULT_SPEAKER)]
        ode = {k: extras.get(k, v) for k, v in ODE_DEFAULTS.items()}
        codes = torch.tensor([stage_input.prompt_token_ids], dtype=torch.long)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            wav = self.model(codes, conditioning=cond, reference_mel=ref_mel, **ode)
        return wav.reshape(-1).float()
