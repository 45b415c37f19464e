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

import logging

import torch

logger = logging.getLogger(__name__)

CAPTURABLE = "grouped_mm"


def choose(device: torch.device, dtype: torch.dtype, *dims: int) -> str | None:
    """The capturable implementation where torch has a kernel for it, else None (the loop).
    `dims`: the experts' matrix sizes (hidden, intermediate); the GPU kernel wants rows of a
    multiple of 16 bytes. On a GPU one small grouped GEMM is tried first: any failure keeps
    the loop (logged), never a stage that cannot start."""
    if device.type == "cpu":
        return CAPTURABLE
    if device.type != "cuda" or dtype != torch.bfloat16 or any(d % 8 for d in dims):
        return None
    if torch.cuda.get_device_capability(device) < (8, 0):
        return None
    try:
        _probe(device, *(dims or (8, 8))[:2])
    except Exception as e:  # e.g. a torch without the kernel: the loop is always there
        logger.warning("MoE experts stay on transformers' loop: grouped_mm failed (%s)", e)
        return None
    return CAPTURABLE


def _probe(device: torch.device, hidden: int, inner: int = 8) -> None:
    """transformers' grouped GEMM as its experts call it: [tokens, hidden] rows against
    [experts, inner, hidden] weights (transposed), split by int32 offsets."""
    from transformers.integrations.moe import _grouped_mm

    rows = torch.zeros(4, hidden, dtype=torch.bfloat16, device=device)
    weight = torch.zeros(2, inner, hidden, dtype=torch.bfloat16, device=device)
    offsets = torch.tensor([2, 4], dtype=torch.int32, device=device)
    out = _grouped_mm(rows, weight.transpose(-2, -1), offs=offsets)
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # a kernel that fails asynchronously fails here
    if out.shape != (4, inner):
        raise RuntimeError(f"grouped_mm gave {tuple(out.shape)}, not (4, {inner})")


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
