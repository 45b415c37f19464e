"""A fused decoder layer's last residual add fused with the norm its output goes to next.

transformers' decoder layers end with `residual + mlp(...)`, and the next thing done with that
sum is a norm: the next layer's input norm, or after the last layer the model's final norm. A
layer installed by omni/runtime/fused_layers.py and linked here (`link_next_norms`) ends with
one add_rms_norm launch instead (kernels/fused_norm.py, the same kernel and rounding as the
layer's first residual add): it returns the sum, as transformers' layer does (recorded hidden
states are that sum), and hands the normed rows to that norm module. The norm uses them only
when it is then called on that very tensor; any other input (Qwen3-Omni's thinker adds its
deepstack rows to a clone between layers) is normed as before, so a hand-over never changes a
result, it only saves the add's launch: one per layer and step.
"""

from __future__ import annotations

import torch
from torch import nn

from kernels.fused_norm import add_rms_norm

NEXT_NORM = "_omni_next_norm"  # layer attribute: the (fused) norm module its output goes to
HANDED = "_omni_handed"  # norm attribute: (the tensor it will be called on, its normed rows)


def link_next_norms(model: nn.Module, fused_norm: object, fused_layer: object) -> int:
    """Link every fused layer of `model`'s decoder stacks (a `layers` ModuleList beside a `norm`)
    to the next layer's input norm, the last one to the stack's final norm, where those norms run
    the fused forward too. fused_norm / fused_layer: the fused forwards (to recognise them).
    Returns the links made."""
    links = 0

    def fused(module: object, forward: object) -> bool:
        method = getattr(module, "__dict__", {}).get("forward")
        return getattr(method, "__func__", None) is forward

    for stack in model.modules():
        layers, final = getattr(stack, "layers", None), getattr(stack, "norm", None)
        if not isinstance(layers, nn.ModuleList) or not isinstance(final, nn.Module):
            continue
        norms = [getattr(layer, "input_layernorm", None) for layer in list(layers)[1:]] + [final]
        for layer, norm in zip(layers, norms, strict=True):
            if fused(layer, fused_layer) and fused(norm, fused_norm):
                layer.__dict__[NEXT_NORM] = norm
                links += 1
    return links


def unlink(model: nn.Module) -> None:
    for module in model.modules():
        module.__dict__.pop(NEXT_NORM, None)
        module.__dict__.pop(HANDED, None)


def finish_layer(layer: nn.Module, residual: torch.Tensor, update: torch.Tensor) -> torch.Tensor:
    """`residual + update`, the layer's output; normed for its next norm in the same launch."""
    norm = layer.__dict__.get(NEXT_NORM)
    if norm is None or update.shape != residual.shape or update.dtype != residual.dtype:
        return residual + update
    normed, out = add_rms_norm(update, residual, norm.weight, norm.variance_epsilon)
    norm.__dict__[HANDED] = (out, normed)
    return out


def take_handed(norm: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor | None:
    """The rows handed to `norm` for exactly this tensor, once; None otherwise."""
    handed = norm.__dict__.pop(HANDED, None)
    return handed[1] if handed is not None and handed[0] is hidden_states else None
