"""Build a stage's module without materialising its parameters, for loading a checkpoint part.

Constructing a transformers module the plain way allocates every parameter on the CPU in float32
and runs its random init, all of which the checkpoint then overwrites: for Qwen3-Omni-30B-A3B's
talker that is ~13 GB of host memory and tens of seconds before a single weight is read.
`build_empty` instead creates the parameters on the meta device (no storage, no init cost) in the
stage's dtype, as transformers' `from_pretrained` does; the loader (stages/qwen3_omni_moe/
weights.py) then assigns each checkpoint tensor straight onto the target device.

Buffers are still built for real on the CPU: the non-persistent ones (rotary `inv_freq`, ...) are
not in a checkpoint and get their values from the module's own constructor; they are small.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import torch

M = TypeVar("M", bound=torch.nn.Module)

# The patch below is process-wide: builds hold this lock so two stages built in threads of one
# process cannot see each other's patch or default dtype half-applied.
_LOCK = threading.Lock()


@contextmanager
def _empty_params(dtype: torch.dtype) -> Iterator[None]:
    """Parameters registered inside go to the meta device; the default dtype is `dtype` (what a
    module builds its parameters and dtype-less buffers in, as under from_pretrained)."""
    register = torch.nn.Module.register_parameter

    def register_on_meta(
        module: torch.nn.Module, name: str, param: torch.nn.Parameter | None
    ) -> None:
        register(module, name, param)
        if param is not None:
            module._parameters[name] = torch.nn.Parameter(
                param.to("meta"), requires_grad=param.requires_grad
            )

    previous = torch.get_default_dtype()
    torch.nn.Module.register_parameter = register_on_meta
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)
        torch.nn.Module.register_parameter = register


def build_empty(factory: Callable[[], M], dtype: torch.dtype) -> M:
    """`factory()` with its parameters on the meta device in `dtype`, buffers real on the CPU."""
    with _LOCK, _empty_params(dtype):
        return factory()


def assign_state(
    module: torch.nn.Module, tensors: dict[str, torch.Tensor], device: torch.device
) -> None:
    """Make `tensors` (every state_dict key, strict) the module's parameters and persistent
    buffers, then move its remaining (non-persistent) buffers to `device`. Tied entries (one
    tensor under two names) must be passed as one tensor, so they stay shared."""
    module.load_state_dict(tensors, strict=True, assign=True)
    module.to(device)
    left = [n for n, t in [*module.named_parameters(), *module.named_buffers()] if t.is_meta]
    if left:
        raise RuntimeError(f"{type(module).__name__}: tensors left unloaded: {left[:3]}")
