"""The omni families bench/gpu.py runs parts 1 and 2 on (--family): what differs between
Qwen2.5-Omni and Qwen3-Omni for the bench (stage names, layouts, budgets, the transformers
class and its generate arguments)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
    """One omni family as bench/gpu.py drives it."""

    name: str  # the checkpoint's model_type (--family)
    title: str  # in headings and table rows
    stages: tuple[str, str, str]  # thinker, talker, vocoder: the shipped stage config's names
    sizes: tuple[str, str]  # --size choices: the real layout (the default), then "tiny"
    codec_tokens: int  # default talker budget: about 5 s of speech
    unit: str  # what one talker step makes: "codes" or (16-code) "frames"
    requests: tuple[int, ...]  # default --requests (levels of N at once)
    talker_prompt_extra: int  # talker prompt positions beyond the thinker's prompt
    vocoder_fp32: bool  # the vocoder stays float32 on a GPU (as transformers runs it)
    hf_class: str  # transformers' class with generate
    codec_eos: tuple[int, ...]  # talker stop ids passed in SamplingParams (empty: the stage's own)


FAMILIES = {
    "qwen2_5_omni": Family(
        name="qwen2_5_omni",
        title="Qwen2.5-Omni",
        stages=("thinker", "talker", "token2wav"),
        sizes=("7b", "tiny"),
        codec_tokens=256,  # 50 codes/s
        unit="codes",
        requests=(16, 64),
        talker_prompt_extra=2,  # speaker + the first code
        vocoder_fp32=True,
        hf_class="Qwen2_5OmniForConditionalGeneration",
        codec_eos=(8292, 8294),  # codec pad / codec end (bench/gpu_checkpoints.py)
    ),
    "qwen3_omni_moe": Family(
        name="qwen3_omni_moe",
        title="Qwen3-Omni",
        stages=("thinker", "talker", "code2wav"),
        sizes=("30b", "tiny"),
        codec_tokens=64,  # 12.5 frames/s: 5.1 s
        unit="frames",
        requests=(16,),
        talker_prompt_extra=9,  # generate's nine assistant positions
        vocoder_fp32=False,
        hf_class="Qwen3OmniMoeForConditionalGeneration",
        codec_eos=(),  # the talker stops on its config's codec EOS
    ),
}


def layout_name(args: argparse.Namespace) -> str:
    """'Qwen3-Omni (30b layout, thinker 24 of 48 layers)': the family, --size and any cut."""
    cut = ""
    if args.layers_cut:
        cut = f", thinker {args.layers} of 48 layers, talker {args.talker_layers} of 20"
    return f"{args.fam.title} ({args.size} layout{cut})"
