"""transformers references for the Qwen3-Omni tests: one `Qwen3OmniMoeForConditionalGeneration.
generate` per case (CPU float32, thinker_do_sample=False, talker_do_sample=False), observed from
the inside: the talker's own `generate` result is captured by wrapping that bound method, so the
codes come from exactly the run that produced the waveform.

Inputs come from omni's Qwen3-Omni prompt processor (ids, pixels, mel features): without
torchvision `Qwen3OmniMoeProcessor` cannot be built, so both sides take the same arrays.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class Qwen3Reference:
    prompt_ids: list[int]
    thinker_ids: list[int]  # generated thinker tokens
    layer0: list[int]  # the talker's generated layer-0 codes (codec EOS included)
    frames: list[list[int]]  # every code group of every decoded frame
    wav: torch.Tensor  # 1-D


def load_hf(model_dir: str):
    """The transformers model, its weights in freshly allocated memory.

    from_pretrained keeps the safetensors file's tensors where the file puts them (measured: most
    not 64-byte aligned, by the header's length and the tensors before), and CPU sgemm sums a row
    in another order when its operand is not 64-byte aligned and the inner dim is not a multiple
    of the vector width (measured: a 24-wide q_proj, last bits differ). omni copies weights into its
    own (aligned) parameters; re-allocating here gives transformers the same, so "equal" compares
    the arithmetic and not where a file put the bytes.
    """
    from transformers import Qwen3OmniMoeForConditionalGeneration

    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32)
    for param in model.parameters():
        param.data = param.data.clone()
    return model.eval()


def generate_kwargs(extras: dict) -> dict:
    """generate's multimodal kwargs from the prompt processor's extras."""
    kwargs = {}
    if "pixel_values" in extras:
        kwargs["pixel_values"] = torch.tensor(np.concatenate(extras["pixel_values"]))
        kwargs["image_grid_thw"] = torch.tensor(np.asarray(extras["image_grid_thw"]))
    if "input_features" in extras:
        (features,) = extras["input_features"]  # one audio per prompt here
        kwargs["input_features"] = torch.tensor(features).unsqueeze(0)
        kwargs["feature_attention_mask"] = torch.ones(1, features.shape[1], dtype=torch.long)
    return kwargs


def run_generate(
    model, prompt_ids: list[int], extras: dict, *, thinker_tokens: int, talker_tokens: int,
    speaker: str,
) -> Qwen3Reference:  # fmt: skip
    seen: dict[str, object] = {}
    original = model.talker.generate

    def talker_generate(*args, **kwargs):
        seen["talker"] = out = original(*args, **kwargs)
        return out

    model.talker.generate = talker_generate
    try:
        with torch.inference_mode():
            sequences, wav = model.generate(
                input_ids=torch.tensor([prompt_ids]),
                thinker_max_new_tokens=thinker_tokens,
                thinker_do_sample=False,
                talker_max_new_tokens=talker_tokens,
                talker_do_sample=False,
                speaker=speaker,
                **generate_kwargs(extras),
            )
    finally:
        del model.talker.generate
    talker = seen["talker"]
    frames = [h[-1][0].tolist() for h in talker.hidden_states if h[-1] is not None]  # type: ignore[attr-defined]
    return Qwen3Reference(
        list(prompt_ids),
        sequences[0, len(prompt_ids) :].tolist(),
        talker.sequences[0].tolist(),  # type: ignore[attr-defined]
        frames,
        wav.reshape(-1),
    )
