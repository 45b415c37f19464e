"""One evaluation of the DiT for streamed chunks (dit_velocity), and the DiT they run.

dit_velocity is the DiT's forward in its own modules' order (Qwen2_5OmniToken2WavDiTModel and
its DiTDecoderLayer) with less repeated work: the speaker encoder runs once per speaker (the
caller's `static` conditioning); the attention masks, which every layer of transformers' forward
builds anew from the block differences (three kernels a layer), once per distinct (look back,
look ahead) reach; the SiLU of the time embedding, which every layer's adaptive norm takes, once.
With `own_layers` it runs transformers' layer forwards as they are instead: the reference that
tests/integration/test_token2wav_dit.py and bench/dit_kernels.py hold it to, bit for bit.
"""

from __future__ import annotations

import copy

import torch


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
    attended = layer.attn(
        hidden_states=norm, position_embeddings=position_embeddings, attention_mask=mask
    )
    hidden = hidden + gate_msa.unsqueeze(1) * attended
    norm = layer.ff_norm(hidden) * (1 + scale_mlp[:, None]) + shift_mlp[:, None]
    return hidden + gate_mlp.unsqueeze(1) * layer.ff(norm)
