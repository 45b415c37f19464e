"""Which MoE experts implementation the Qwen3-Omni thinker and talker run.

transformers' default ("eager") loops over the experts that the step's tokens picked, found with
`nonzero()`: one host sync per MoE layer per step (48 for the real thinker), and a loop whose
length the data decides, so such a step can never be captured as a CUDA graph. "grouped_mm"
sorts the token-expert pairs on the device and runs one grouped GEMM per projection: no host
read, fixed launches. torch has that kernel for bfloat16 on SM80+ GPUs (sizes a multiple of 8)
and for the CPU; on the CPU it is bit-equal to the loop (the Qwen3-Omni tests compare waveforms
with torch.equal against transformers' generate, which keeps its default). Elsewhere (float32 or
float16 on a GPU) the loop stays, and the thinker's decode steps stay eager.
"""

from __future__ import annotations

import torch

CAPTURABLE = "grouped_mm"


def choose(device: torch.device, dtype: torch.dtype, *dims: int) -> str | None:
    """The capturable implementation where torch has a kernel for it, else None (the loop).
    `dims`: the experts' matrix sizes (hidden, intermediate); the GPU kernel wants rows of a
    multiple of 16 bytes."""
    if device.type == "cpu":
        return CAPTURABLE
    if device.type == "cuda" and dtype == torch.bfloat16 and all(d % 8 == 0 for d in dims):
        return CAPTURABLE if torch.cuda.get_device_capability(device) >= (8, 0) else None
    return None


def install(model: torch.nn.Module, implementation: str | None) -> int:
    """Point every experts module of `model` at `implementation` (read per forward from the
    module's config); returns how many there are."""
    experts = [m for m in model.modules() if hasattr(m, "_is_expert_parallel")]
    for module in experts:
        if implementation is not None:
            module.config._experts_implementation = implementation
    return len(experts)


def blocker(model: torch.nn.Module) -> str | None:
    """Why `model`'s experts cannot run inside a CUDA graph (None: they can, or it has none)."""
    for module in model.modules():
        if hasattr(module, "_is_expert_parallel"):
            implementation = module.config._experts_implementation
            if implementation != CAPTURABLE:
                return (
                    f"MoE experts run {implementation!r} (a host sync per layer); {CAPTURABLE!r} "
                    "needs bfloat16 on an SM80+ GPU"
                )
    return None
