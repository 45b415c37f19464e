"""Load one part of a Qwen3-Omni checkpoint into its module (talker, code2wav).

Checkpoints store each MoE expert as separate gate_proj / up_proj / down_proj matrices
(`...mlp.experts.<e>.gate_proj.weight`), while transformers' modules hold them fused per layer:
`experts.gate_up_proj` [experts, 2 * inter, hidden] (gate rows, then up rows) and
`experts.down_proj` [experts, hidden, inter]. Everything else is copied by name.
"""

from __future__ import annotations

import re

import torch
from safetensors import safe_open

from stages.qwen2_5_omni.part_loader import _shards

_FUSED = re.compile(r"^(.*\.experts)\.(gate_up_proj|down_proj)$")


def load_part(module: torch.nn.Module, model_dir: str, prefix: str) -> None:
    """Copy `prefix + name` checkpoint tensors into `module` (strict), fusing expert weights."""
    shards = _shards(model_dir)
    state = module.state_dict()
    handles: dict[str, object] = {}

    def read(name: str) -> torch.Tensor:
        path = shards.get(prefix + name)
        if path is None:
            raise ValueError(f"{model_dir!r} has no tensor {prefix + name!r}")
        if path not in handles:
            handles[path] = safe_open(path, framework="pt")
        return handles[path].get_tensor(prefix + name)  # type: ignore[attr-defined]

    with torch.no_grad():
        for key, target in state.items():
            fused = _FUSED.match(key)
            if fused is None or prefix + key in shards:
                target.copy_(read(key))
                continue
            base, kind = fused.groups()
            for expert in range(target.shape[0]):
                if kind == "down_proj":
                    target[expert].copy_(read(f"{base}.{expert}.down_proj.weight"))
                else:
                    gate = read(f"{base}.{expert}.gate_proj.weight")
                    up = read(f"{base}.{expert}.up_proj.weight")
                    target[expert].copy_(torch.cat([gate, up]))
