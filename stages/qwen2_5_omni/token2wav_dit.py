"""One evaluation of the DiT for streamed chunks (dit_velocity), and the DiT they run.

dit_velocity is the DiT's forward in its own modules' order (Qwen2_5OmniToken2WavDiTModel and
its DiTDecoderLayer) with less repeated work: the speaker encoder runs once per speaker (the
caller's `static` conditioning); the attention masks, which every layer of transformers' forward
builds anew from the block differences (three kernels a layer), once per distinct (look back,
look ahead) reach; the SiLU of the time embedding, which every layer's adaptive norm takes, once;
the rotary embedding of the first head (the only one the checkpoint rotates) for its query and
key together: 9 kernels a layer instead of 14, the same elementwise arithmetic; and the
attention's input cast once for its three projections, not by autocast in each.
With `own_layers` it runs transformers' layer forwards as they are instead: the reference that
tests/integration/test_token2wav_dit.py and bench/dit_kernels.py hold it to, bit for bit.
"""

from __future__ import annotations

import copy

import torch
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS


def dit_velocity(
    dit: torch.nn.Module,
    time_step: torch.Tensor,
    state: torch.Tensor,
    static: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    block_diff: torch.Tensor,
    guidance: torch.Tensor,
    *,
    autocast: torch.dtype | None = None,
    own_layers: bool = False,
) -> torch.Tensor:
    """One evaluation of the ODE: the DiT's own modules in its order (speaker encoder hoisted
    out into `static`), the conditioned and null (CFG) rows of every job in one forward,
    combined by each job's guidance. autocast: the forward's matmul dtype under torch.autocast
    (norms, softmax and the time sinusoid stay float32); the result is float32. Device work
    only (no host sync): capturable. own_layers: each DiTDecoderLayer's forward as it is."""
    num_rows = state.shape[0]
    enabled = autocast is not None
    with torch.autocast(state.device.type, dtype=autocast or torch.bfloat16, enabled=enabled):
        time_embedding = dit.time_embed(time_step.repeat(2 * num_rows))
        hidden = dit.input_embed.proj(torch.cat((torch.cat([state, state]), static), dim=-1))
        block_diff = block_diff.expand(-1, dit.num_attention_heads, -1, -1)
        masks: dict[tuple[float, float], torch.Tensor] = {}
        # each layer's adaptive-norm input (its own forward computes it)
        activated = None if own_layers else torch.nn.functional.silu(time_embedding)
        for layer in dit.transformer_blocks:
            if activated is None:
                embedding = (cos, sin)
                hidden = layer(hidden, time_embedding, embedding, block_diff=block_diff)
                continue
            reach = (-float(layer.look_backward_block), float(layer.look_ahead_block))
            if reach not in masks:  # the layer's own forward would compute it each time
                masks[reach] = (block_diff >= reach[0]) & (block_diff <= reach[1])
            hidden = dit_block(layer, hidden, activated, (cos, sin), masks[reach])
        output = dit.proj_out(dit.norm_out(hidden, time_embedding))
    guided, null = torch.chunk(output.float(), 2, dim=0)
    return guided + (guided - null) * guidance


def matmul_copy(dit: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """The DiT with its Linear layers' weights and biases stored in `dtype` (new tensors) and
    every other parameter and buffer shared. Under torch.autocast(dtype) it computes exactly what
    the float32 DiT does: autocast casts a Linear's float32 weights to dtype at every call (two
    kernels a layer, 14 a DiT block, in every replayed evaluation) and leaves dtype ones as
    they are; norms and embeddings keep their float32 parameters."""
    memo: dict[int, object] = {}
    for module in dit.modules():
        for tensor in [*module.parameters(recurse=False), *module.buffers(recurse=False)]:
            converted = isinstance(module, torch.nn.Linear) and tensor.is_floating_point()
            memo[id(tensor)] = (
                torch.nn.Parameter(tensor.detach().to(dtype), requires_grad=False)
                if converted
                else tensor
            )
    return copy.deepcopy(dit, memo)


def eager_velocity(
    dit: torch.nn.Module,
    inputs: tuple[torch.Tensor, ...],
    autocast: torch.dtype | None,
    time_step: torch.Tensor,
    state: torch.Tensor,
) -> torch.Tensor:
    """dit_velocity with a solve's inputs bound first (the RK4 solver passes time and state)."""
    return dit_velocity(dit, time_step, state, *inputs, autocast=autocast)


def dit_block(
    layer: torch.nn.Module,
    hidden: torch.Tensor,
    activated: torch.Tensor,
    position_embeddings: tuple[torch.Tensor, torch.Tensor],
    mask: torch.Tensor,
) -> torch.Tensor:
    """A DiTDecoderLayer's forward (its AdaLayerNormZero's too), given its attention mask and
    `activated`, the SiLU of the time embedding, which each layer's norm would compute anew."""
    adaptive = layer.attn_norm
    modulation = torch.chunk(adaptive.linear(activated), 6, dim=1)
    shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = modulation
    norm = adaptive.norm(hidden) * (1 + scale_msa[:, None]) + shift_msa[:, None]
    attended = dit_attention(layer.attn, norm, position_embeddings, mask)
    hidden = hidden + gate_msa.unsqueeze(1) * attended
    norm = layer.ff_norm(hidden) * (1 + scale_mlp[:, None]) + shift_mlp[:, None]
    return hidden + gate_mlp.unsqueeze(1) * layer.ff(norm)


def dit_attention(
    attn: torch.nn.Module,
    hidden: torch.Tensor,
    position_embeddings: tuple[torch.Tensor, torch.Tensor],
    mask: torch.Tensor,
) -> torch.Tensor:
    """DiTAttention's forward with its input cast once (not by autocast in each of the three
    projections) and the first head's query and key rotated together. Its own forward
    deinterleaves each (the checkpoint's interleaved layout), rotates each (rotate_half:
    a negation and a concatenation), multiplies by cos and sin, adds, and copies each back: 14
    kernels. Stacked first, the same operations on both at once are 9, and every element
    meets the same arithmetic in the same dtypes (the products promote to float32 with cos and
    sin; the copy back rounds once)."""
    batch_size, heads = hidden.shape[0], attn.heads
    # Cast once for the three projections, to what autocast would cast it to in each: on a GPU
    # the adaptive norm's output is float32 (CUDA autocast runs layer_norm in float32).
    device = hidden.device.type
    if torch.is_autocast_enabled(device):
        hidden = hidden.to(torch.get_autocast_dtype(device))
    query, key, value = attn.to_q(hidden), attn.to_k(hidden), attn.to_v(hidden)
    head_dim = key.shape[-1] // heads
    query = query.view(batch_size, -1, heads, head_dim).transpose(1, 2)
    key = key.view(batch_size, -1, heads, head_dim).transpose(1, 2)
    value = value.view(batch_size, -1, heads, head_dim).transpose(1, 2)
    cos, sin = (t.unsqueeze(1) for t in position_embeddings)
    first = torch.cat((query[:, :1], key[:, :1]), dim=1)  # [batch, 2, frames, head_dim]
    even, odd = first[..., 0::2], first[..., 1::2]
    rotated = torch.cat((even, odd), dim=-1) * cos + torch.cat((-odd, even), dim=-1) * sin
    query[:, :1], key[:, :1] = rotated[:, :1], rotated[:, 1:]
    interface = ALL_ATTENTION_FUNCTIONS[attn.config._attn_implementation]
    weights, _ = interface(attn, query, key, value, attention_mask=mask, is_causal=False)
    weights = weights.reshape(batch_size, -1, heads * head_dim).to(query.dtype)
    return attn.to_out[1](attn.to_out[0](weights))
