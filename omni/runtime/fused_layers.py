"""Fused Triton kernels swapped into transformers' decoder layers of a CUDA stage (opt-in).

install_fused_kernels(model) replaces, per module instance, the forward of the Qwen2, Llama and
Qwen2.5-Omni (thinker text model, talker, vision blocks) modules below; the classes and every
other instance are left alone, and the CPU path runs transformers' own modules as before.

- RMSNorm: one kernel (kernels/fused_norm.py) instead of eight.
- Decoder layer: input norm -> self_attn (called as transformers calls it, so the paged hook
  `omni_paged` and its kwargs such as omni_attn pass through) -> residual add + post-attention
  norm in one kernel -> MLP -> residual add.
- Attention: q/k/v in one GEMM (their weights concatenated once, each nn.Linear keeping a view
  of its rows: no extra memory, same state_dict), rotary on q and k in place in one kernel
  (kernels/fused_rotary.py), then the registered attention function and o_proj as before.
- MLP (SiLU): gate/up in one GEMM (concatenated the same way), SiLU*mul in one kernel
  (kernels/fused_activation.py), down_proj.

Per layer a bf16 decode step goes from ~40 kernels to ~12. Numerics: the kernels round where
transformers rounds (bit-equal in tests under Triton's interpreter); the concatenated GEMMs may
pick other cuBLAS tilings than the separate ones (bf16 rounding-level differences).

Call it after the model is on its device and in its dtype (the concatenated weights are not
module parameters: a later .to() would not move them).
"""

from __future__ import annotations

import logging
import sys
import types
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from kernels.fused_activation import silu_and_mul
from kernels.fused_norm import MAX_HIDDEN, add_rms_norm, rms_norm
from kernels.fused_rotary import rotary_, rotary_and_cache_
from kernels.triton_launch import HAVE_TRITON
from omni.runtime.fused_residual import finish_layer, link_next_norms, take_handed, unlink

logger = logging.getLogger(__name__)

# Classes whose forward was checked line by line against the fused one (transformers 5.23).
# Qwen3-Omni's (thinker text model, talker, code predictor): the norms, the layers' residual
# adds, the attention (q_norm and k_norm on the fused projection's heads, before rotary), the
# dense MLPs; not its MoE blocks.
NORM_CLASSES = frozenset({"Qwen2RMSNorm", "LlamaRMSNorm", "Qwen2_5OmniRMSNorm",
                          "Qwen3OmniMoeThinkerTextRMSNorm", "Qwen3OmniMoeTextRMSNorm",
                          "Qwen3OmniMoeRMSNorm"})  # fmt: skip
LAYER_CLASSES = frozenset({"Qwen2DecoderLayer", "LlamaDecoderLayer", "Qwen2_5OmniDecoderLayer",
                           "Qwen3OmniMoeThinkerTextDecoderLayer", "Qwen3OmniMoeTalkerDecoderLayer",
                           "Qwen3OmniMoeTalkerCodePredictorDecoderLayer"})  # fmt: skip
ATTENTION_CLASSES = frozenset({"Qwen2Attention", "LlamaAttention", "Qwen2_5OmniAttention",
                               "Qwen3OmniMoeThinkerTextAttention",
                               "Qwen3OmniMoeTalkerCodePredictorAttention"})  # fmt: skip
MLP_CLASSES = frozenset({"Qwen2MLP", "LlamaMLP", "Qwen2_5OmniMLP", "Qwen3OmniMoeThinkerTextMLP",
                         "Qwen3OmniMoeMLP", "Qwen3OmniMoeTalkerTextMLP"})  # fmt: skip
SILU_CLASSES = frozenset({"SiLU", "SiLUActivation"})
FUSED = "_omni_fused"  # instance attribute: the fused projection of an attention/MLP module


@dataclass(frozen=True)
class FusedProjection:
    """Several nn.Linear of one input as one GEMM: weight/bias hold their rows in order."""

    weight: torch.Tensor
    bias: torch.Tensor | None
    sizes: tuple[int, ...]


def _norm_forward(self: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    handed = take_handed(self, hidden_states)  # the previous layer's last add normed it
    return (
        handed
        if handed is not None
        else rms_norm(hidden_states, self.weight, self.variance_epsilon)
    )


def _layer_forward(
    self: nn.Module,
    hidden_states: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
    past_key_values: Any = None,
    use_cache: bool | None = False,
    position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
    **kwargs: Any,
) -> torch.Tensor:
    """transformers' decoder layer with the first residual add fused into the second norm, and
    the last into the next norm (fused_residual.py)."""
    attn_out, _ = self.self_attn(
        hidden_states=self.input_layernorm(hidden_states),
        attention_mask=attention_mask,
        position_ids=position_ids,
        past_key_values=past_key_values,
        use_cache=use_cache,
        position_embeddings=position_embeddings,
        **kwargs,
    )
    norm = self.post_attention_layernorm
    if attn_out.dtype == hidden_states.dtype and attn_out.shape == hidden_states.shape:
        normed, residual = add_rms_norm(attn_out, hidden_states, norm.weight, norm.variance_epsilon)
    else:  # not met by the listed classes; kept exact rather than assumed
        residual = hidden_states + attn_out
        normed = norm(residual)
    return finish_layer(self, residual, self.mlp(normed))  # + the next norm (fused_residual.py)


def _attention_forward(
    self: nn.Module,
    hidden_states: torch.Tensor,
    position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
    attention_mask: torch.Tensor | None = None,
    past_key_values: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """transformers' Qwen2/Llama/Qwen2.5-Omni attention with q/k/v as one GEMM and rotary as one
    kernel. position_ids, use_cache, omni_attn, ... reach the attention function in kwargs, as
    they do from the original forwards."""
    fused: FusedProjection = self.__dict__[FUSED]
    num_heads, num_kv_heads = (n // self.head_dim for n in fused.sizes[:2])
    input_shape = hidden_states.shape[:-1]
    qkv = nn.functional.linear(hidden_states, fused.weight, fused.bias)
    heads = qkv.view(*input_shape, num_heads + 2 * num_kv_heads, self.head_dim)
    if hasattr(self, "q_norm"):  # Qwen3: each head of q and k RMS-normed before rotary
        kv_end = num_heads + num_kv_heads
        heads[..., :num_heads, :] = self.q_norm(heads[..., :num_heads, :])
        heads[..., num_heads:kv_end, :] = self.k_norm(heads[..., num_heads:kv_end, :])
    if position_embeddings is None:
        raise ValueError(f"{type(self).__name__} needs position_embeddings")
    cos, sin = position_embeddings
    rows = (*input_shape, self.head_dim)
    modeling = sys.modules[type(self).__module__]
    if cos.shape == rows and sin.shape == rows and cos.dtype == sin.dtype == qkv.dtype:
        flat = heads.view(-1, *heads.shape[-2:])
        rotated = flat[:, : num_heads + num_kv_heads]
        cos, sin = cos.reshape(-1, self.head_dim), sin.reshape(-1, self.head_dim)
        meta = kwargs.get("omni_attn") if past_key_values is None else None
        if meta is not None and meta.kv_caches[self.layer_idx][0].dtype == qkv.dtype:
            values = flat[:, num_heads + num_kv_heads :]  # our paged hook's K/V write, here
            caches = meta.kv_caches[self.layer_idx]
            rotary_and_cache_(rotated, cos, sin, values, *caches, meta.slot_mapping)
            kwargs["omni_kv_cached"] = True  # the hook then skips its own write
        else:
            rotary_(rotated, cos, sin)
        query = heads[..., :num_heads, :].transpose(1, 2)
        key = heads[..., num_heads : num_heads + num_kv_heads, :].transpose(1, 2)
    else:  # broadcast or other-dtype cos/sin (not what the models pass): transformers' rotary
        query, key = modeling.apply_rotary_pos_emb(
            heads[..., :num_heads, :].transpose(1, 2),
            heads[..., num_heads : num_heads + num_kv_heads, :].transpose(1, 2),
            cos,
            sin,
        )
    value = heads[..., num_heads + num_kv_heads :, :].transpose(1, 2)
    if past_key_values is not None:
        key, value = past_key_values.update(key, value, self.layer_idx)
    interface = ALL_ATTENTION_FUNCTIONS.get_interface(
        self.config._attn_implementation, modeling.eager_attention_forward
    )
    if hasattr(self, "sliding_window"):  # Qwen2 and Qwen2.5-Omni pass it, Llama has none
        kwargs["sliding_window"] = self.sliding_window
    attn_output, attn_weights = interface(
        self,
        query,
        key,
        value,
        attention_mask,
        dropout=0.0 if not self.training else self.attention_dropout,
        scaling=self.scaling,
        **kwargs,
    )
    attn_output = attn_output.reshape(*input_shape, -1).contiguous()
    return self.o_proj(attn_output), attn_weights


def _mlp_forward(self: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    fused: FusedProjection = self.__dict__[FUSED]
    gate_up = nn.functional.linear(hidden_states, fused.weight, fused.bias)
    return self.down_proj(silu_and_mul(gate_up))


def _fuse_linears(linears: list[nn.Module]) -> FusedProjection | None:
    """Concatenate the weights (and biases) of plain nn.Linear of one input, dtype and device;
    each module's parameters become views of its rows. None (nothing changed) otherwise."""
    if any(type(linear) is not nn.Linear for linear in linears):
        return None
    weights = [linear.weight for linear in linears]
    if len({(w.dtype, w.device, w.shape[1]) for w in weights}) != 1:
        return None
    biases = [linear.bias for linear in linears]
    if any(b is None for b in biases) and not all(b is None for b in biases):
        return None
    with torch.no_grad():
        weight = torch.cat([w.detach() for w in weights])
        bias = None if biases[0] is None else torch.cat([b.detach() for b in biases])
    sizes = tuple(w.shape[0] for w in weights)
    start = 0
    for linear, size in zip(linears, sizes, strict=True):
        grad = linear.weight.requires_grad
        linear.weight = nn.Parameter(weight[start : start + size], requires_grad=grad)
        if bias is not None:
            linear.bias = nn.Parameter(bias[start : start + size], requires_grad=grad)
        start += size
    return FusedProjection(weight, bias, sizes)


def _target(module: nn.Module) -> str | None:
    """Which fused forward fits this module, if any."""
    name = type(module).__name__
    if not type(module).__module__.startswith("transformers.models."):
        return None
    if name in NORM_CLASSES and module.weight.dim() == 1 and module.weight.numel() <= MAX_HIDDEN:
        return "norm"
    if name in LAYER_CLASSES and all(
        isinstance(getattr(module, n, None), nn.Module) and _target(getattr(module, n)) == "norm"
        for n in ("input_layernorm", "post_attention_layernorm")
    ):
        return "layer"
    if name in ATTENTION_CLASSES and all(
        hasattr(module, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj", "head_dim")
    ):
        return "attention"
    if name in MLP_CLASSES and type(getattr(module, "act_fn", None)).__name__ in SILU_CLASSES:
        return "mlp"
    return None


FORWARDS = {
    "norm": _norm_forward,
    "layer": _layer_forward,
    "attention": _attention_forward,
    "mlp": _mlp_forward,
}
PROJECTIONS = {"attention": ("q_proj", "k_proj", "v_proj"), "mlp": ("gate_proj", "up_proj")}


def install_fused_kernels(model: nn.Module, *, interpret_on_cpu: bool = False) -> int:
    """Swap in the fused forwards on every fitting module whose parameters live on a CUDA
    device; returns how many modules were patched (0 without triton). Idempotent.

    interpret_on_cpu: also patch modules on the CPU, whose kernels then run under Triton's
    interpreter (tests only: slow)."""
    if not HAVE_TRITON:
        logger.warning("fused kernels need triton: none installed")
        return 0
    devices = {"cuda", "cpu"} if interpret_on_cpu else {"cuda"}
    patched = 0
    for module in model.modules():
        kind = _target(module)
        param = next(module.parameters(), None)
        if kind is None or param is None or param.device.type not in devices:
            continue
        forward = module.__dict__.get("forward")
        if forward is not None:  # ours (already installed) or another wrapper (kept)
            continue
        if kind in PROJECTIONS:
            fused = _fuse_linears([getattr(module, n) for n in PROJECTIONS[kind]])
            if fused is None:
                continue
            module.__dict__[FUSED] = fused
        module.forward = types.MethodType(FORWARDS[kind], module)
        patched += 1
    link_next_norms(model, _norm_forward, _layer_forward)
    logger.info("fused kernels installed on %d modules", patched)
    return patched


def uninstall_fused_kernels(model: nn.Module) -> int:
    """Restore the original forwards (benchmarks, tests); returns how many were restored. The
    weights stay concatenated, which the original forwards read as before."""
    restored = 0
    unlink(model)
    for module in model.modules():
        forward = module.__dict__.get("forward")
        if isinstance(forward, types.MethodType) and forward.__func__ in FORWARDS.values():
            del module.forward
            module.__dict__.pop(FUSED, None)
            restored += 1
    return restored
