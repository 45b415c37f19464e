"""Load one part of a Qwen3-Omni checkpoint into its module (talker, code2wav).

Checkpoints store each MoE expert as separate gate_proj / up_proj / down_proj matrices
(`...mlp.experts.<e>.gate_proj.weight`), while transformers' modules hold them fused per layer:
`experts.gate_up_proj` [experts, 2 * inter, hidden] (gate rows, then up rows) and
`experts.down_proj` [experts, hidden, inter]. Everything else is read by name.

The module comes from stages/meta_build.py's `build_empty` (parameters on the meta device, in the
stage's dtype): each tensor is read, cast to its parameter's dtype and put on the device one at a
time, and a fused tensor is filled on the device expert by expert, so the host never holds more
than one checkpoint tensor beyond the safetensors reader.
"""

from __future__ import annotations

import re

import torch
from safetensors import safe_open

from stages.meta_build import assign_state
from stages.qwen2_5_omni.part_loader import _shards

_FUSED = re.compile(r"^(.*\.experts)\.(gate_up_proj|down_proj)$")


def load_part(module: torch.nn.Module, model_dir: str, prefix: str, device: torch.device) -> None:
    """Load `prefix + name` checkpoint tensors as `module`'s (strict) on `device`, fusing expert
    weights; `module` is built by `build_empty`, or real (its tensors are then replaced)."""
    shards = _shards(model_dir)
    handles: dict[str, object] = {}

    def read(name: str) -> torch.Tensor:
        path = shards.get(prefix + name)
        if path is None:
            raise ValueError(f"{model_dir!r} has no tensor {prefix + name!r}")
        if path not in handles:
            handles[path] = safe_open(path, framework="pt")
        return handles[path].get_tensor(prefix + name)  # type: ignore[attr-defined]

    loaded: dict[str, torch.Tensor] = {}
    shared: dict[int, torch.Tensor] = {}  # id(target) -> its loaded tensor: tied names stay tied
    with torch.no_grad():
        for key, target in module.state_dict(keep_vars=True).items():
            if id(target) in shared:
                loaded[key] = shared[id(target)]
                continue
            fused = _FUSED.match(key)
            if fused is None or prefix + key in shards:
                tensor = read(key).to(device=device, dtype=target.dtype)
            else:
                base, kind = fused.groups()
                tensor = torch.empty(target.shape, dtype=target.dtype, device=device)
                for expert in range(target.shape[0]):
                    if kind == "down_proj":
                        tensor[expert].copy_(read(f"{base}.{expert}.down_proj.weight"))
                    else:
                        gate = read(f"{base}.{expert}.gate_proj.weight")
                        up = read(f"{base}.{expert}.up_proj.weight")
                        tensor[expert].copy_(torch.cat([gate, up]))
            loaded[key] = shared[id(target)] = tensor
    assign_state(module, loaded, device)
