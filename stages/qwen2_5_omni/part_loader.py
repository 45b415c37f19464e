"""Load one part (talker, token2wav, thinker embedding rows) of a Qwen2.5-Omni checkpoint.

Each stage of the pipeline loads only its own part of the shared directory: reading the whole
composite model in every stage would multiply memory by the number of stages. Tensors are read
lazily with safetensors' `safe_open`, so a part costs only its own bytes.
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch
from safetensors import safe_open
from transformers import Qwen2_5OmniConfig
from transformers.utils import logging as hf_logging


def _shards(model_dir: str) -> dict[str, str]:
    """Tensor name -> shard file, for single-file and sharded (index.json) checkpoints."""
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
        return {name: os.path.join(model_dir, shard) for name, shard in weight_map.items()}
    single = os.path.join(model_dir, "model.safetensors")
    if not os.path.exists(single):
        raise ValueError(f"{model_dir!r} has no model.safetensors(.index.json)")
    with safe_open(single, framework="pt") as f:
        return {name: single for name in f.keys()}  # noqa: SIM118 (safe_open is not a dict)


def load_part(module: torch.nn.Module, model_dir: str, prefix: str) -> None:
    """Copy every checkpoint tensor named `prefix + name` into `module`'s `name` (strict)."""
    shards = _shards(model_dir)
    state = module.state_dict()
    missing = [k for k in state if prefix + k not in shards]
    if missing:
        raise ValueError(
            f"{model_dir!r} lacks {len(missing)} {prefix}* tensors, e.g. {missing[:3]}"
        )
    by_file: dict[str, list[str]] = {}
    for key in state:
        by_file.setdefault(shards[prefix + key], []).append(key)
    with torch.no_grad():
        for path, keys in by_file.items():
            with safe_open(path, framework="pt") as f:
                for key in keys:
                    state[key].copy_(f.get_tensor(prefix + key))


def load_rows(model_dir: str, name: str, rows: list[int]) -> dict[int, torch.Tensor]:
    """Selected rows of one 2-D checkpoint tensor (e.g. a few embedding rows of a large vocab)."""
    path = _shards(model_dir).get(name)
    if path is None:
        raise ValueError(f"{model_dir!r} has no tensor {name!r}")
    with safe_open(path, framework="pt") as f:
        table = f.get_slice(name)
        return {r: table[r : r + 1][0].clone() for r in sorted(set(rows))}


def load_speakers(model_dir: str) -> dict[str, dict]:
    """spk_dict.pt: {speaker: {"bos_token": int, "cond": [1, E], "ref_mel": [1, T, 80]}}."""
    path = os.path.join(model_dir, "spk_dict.pt")
    if not os.path.exists(path):
        raise ValueError(f"{model_dir!r} has no spk_dict.pt (Qwen2.5-Omni speakers)")
    return torch.load(path, weights_only=True)


def part_config(model_dir: str, part: str) -> Any:
    """The config of one part ("talker", "token2wav") of the checkpoint's composite config.

    Loading the composite config makes transformers warn that text token ids (e.g.
    tts_text_start_token_id) lie outside the talker's codec vocabulary: true of the real
    checkpoint too, and nothing to do with either part. Errors still show."""
    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        config = Qwen2_5OmniConfig.from_pretrained(model_dir)
    finally:
        hf_logging.set_verbosity(level)
    return getattr(config, f"{part}_config")
