"""transformers references for the Qwen2.5-Omni talker / token2wav tests.

One `Qwen2_5OmniForConditionalGeneration.generate` call is observed from the inside: the
thinker's and the talker's own `generate` results are captured by wrapping those two bound
methods on the instance, so the references come from exactly the run that produced the waveform.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from omni.messages import PromptInput, StageResult


@dataclass
class OmniReference:
    prompt_ids: list[int]
    thinker_ids: list[int]  # generated thinker tokens of this row
    hidden: torch.Tensor  # [P + G - 1, D] last layer (normed)
    embeds: torch.Tensor  # [P + G - 1, D] layer 0
    codes: list[int]  # talker codes up to and including the first codec EOS
    wav: torch.Tensor | None


def load_hf(model_dir: str):
    from transformers import Qwen2_5OmniForConditionalGeneration

    return Qwen2_5OmniForConditionalGeneration.from_pretrained(
        model_dir, dtype=torch.float32
    ).eval()


def run_generate(
    model,
    prompts: list[list[int]],
    *,
    thinker_tokens: int,
    talker_tokens: int,
    seed: int = 0,
    media: dict | None = None,
    talker_repetition_penalty: float = 1.05,
) -> list[OmniReference]:
    """Full generate on `prompts` (left-padded into one batch when several), greedy talker.

    media: multimodal generate kwargs for a single prompt (thinker_pixel_values, image_grid_thw,
    input_features, feature_attention_mask), e.g. tools.omni_preprocess's generate_kwargs."""
    seen: dict[str, object] = {}

    def wrap(name):
        original = getattr(model, name).generate

        def generate(*args, **kwargs):
            out = original(*args, **kwargs)
            seen[name] = (kwargs, out)
            return out

        return generate

    model.thinker.generate = wrap("thinker")
    model.talker.generate = wrap("talker")
    try:
        width = max(len(p) for p in prompts)
        pad = model.config.thinker_config.pad_token_id or 0
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        torch.manual_seed(seed)
        with torch.inference_mode():
            _, wavs = model.generate(
                input_ids=ids,
                attention_mask=mask,
                thinker_max_new_tokens=thinker_tokens,
                talker_max_new_tokens=talker_tokens,
                talker_do_sample=False,
                talker_repetition_penalty=talker_repetition_penalty,
                **(media or {}),
            )
    finally:
        del model.thinker.generate, model.talker.generate
    wavs = [wavs] if len(prompts) == 1 else wavs
    thinker = seen["thinker"][1]
    talker_kwargs, talker_out = seen["talker"]
    codes_all = talker_out[:, talker_kwargs["input_ids"].shape[1] :]
    refs = []
    for row, prompt in enumerate(prompts):
        left = width - len(prompt)
        gen = thinker.sequences[row, width:].tolist()
        steps = thinker.hidden_states
        hidden = torch.cat([steps[0][-1][row, left:]] + [s[-1][row] for s in steps[1:]])
        embeds = torch.cat([steps[0][0][row, left:]] + [s[0][row] for s in steps[1:]])
        codes = codes_all[row].tolist()
        for i, c in enumerate(codes):
            if c in (8292, 8294):
                codes = codes[: i + 1]
                break
        refs.append(OmniReference(prompt, gen, hidden, embeds, codes, wavs[row]))
    return refs


def thinker_result(ref: OmniReference, request_id: str = "r0") -> dict[str, StageResult]:
    """The upstream dict a pipeline would hand thinker_to_talker, from transformers' thinker."""
    result = StageResult(
        request_id=request_id,
        stage="thinker",
        prompt_token_ids=list(ref.prompt_ids),
        token_ids=list(ref.thinker_ids),
        finish_reason="length",
        tensors={"hidden_states": ref.hidden.clone(), "inputs_embeds": ref.embeds.clone()},
    )
    return {"thinker": result}


def prompt_input(ref: OmniReference, request_id: str = "r0", **kw) -> PromptInput:
    return PromptInput(request_id, list(ref.prompt_ids), **kw)
