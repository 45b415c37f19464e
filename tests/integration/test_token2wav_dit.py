"""dit_velocity (stages/qwen2_5_omni/token2wav_dit.py) against the DiT's own layers: the same
velocity bit for bit, float32 and under autocast, with each attention mask built once per reach
instead of once per layer, the time embedding's SiLU once and the first head's query and key
rotated together (on the amplified tiny DiT, whose layers mix frames)."""

from __future__ import annotations

import copy

import pytest
import torch

from stages.qwen2_5_omni.token2wav import OmniToken2WavAdapter
from stages.qwen2_5_omni.token2wav_chunks import _block_diff
from stages.qwen2_5_omni.token2wav_dit import dit_attention, dit_velocity, matmul_copy
from tests.integration.test_token2wav_precision import OpCounter
from tests.integration.test_token2wav_stream import amplify_dit

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("autocast", [None, torch.bfloat16], ids=str)
def test_the_velocity_equals_the_layers_with_masks_built_once_per_reach(omni_dir, autocast):
    dit = amplify_dit(OmniToken2WavAdapter(omni_dir)).dit
    # The tiny DiT's two layers reach differently; a third with the first's reach shares its
    # mask (the 7B DiT's 22 layers have three reaches).
    dit.transformer_blocks.append(copy.deepcopy(dit.transformer_blocks[0]))
    reaches = {
        (layer.look_backward_block, layer.look_ahead_block) for layer in dit.transformer_blocks
    }
    rows, frames = 2, 3 * dit.block_size
    generator = torch.Generator().manual_seed(3)
    state = torch.randn(rows, frames, dit.mel_dim, generator=generator)
    static = torch.randn(
        2 * rows, frames, dit.input_embed.proj.in_features - dit.mel_dim, generator=generator
    )
    cos, sin = dit.rotary_embed(state, torch.arange(frames).repeat(2 * rows, 1))
    block_diff = _block_diff([frames, frames - 30], frames, dit.block_size)
    inputs = (static, cos, sin, block_diff, torch.tensor([0.5, 0.0]).view(rows, 1, 1))
    time = torch.tensor(0.4)
    with torch.inference_mode(), OpCounter() as theirs:
        want = dit_velocity(dit, time, state, *inputs, autocast=autocast, own_layers=True)
    with torch.inference_mode(), OpCounter() as ours:
        got = dit_velocity(dit, time, state, *inputs, autocast=autocast)
    assert torch.equal(got, want)
    assert theirs.ops["ge"] == len(dit.transformer_blocks)
    assert ours.ops["ge"] == len(reaches) < len(dit.transformer_blocks)
    # the time embedding's SiLU once, not in each layer's adaptive norm
    assert theirs.ops["silu"] - ours.ops["silu"] == len(dit.transformer_blocks) - 1
    # the first head's query and key rotated together: one negation a layer, not two
    assert theirs.ops["neg"] - ours.ops["neg"] == len(dit.transformer_blocks)
    assert sum(ours.ops.values()) < sum(theirs.ops.values())


def test_the_attention_casts_a_float32_input_once(omni_dir):
    """On a GPU the adaptive norm's output is float32 (CUDA autocast runs layer_norm in float32),
    and autocast casts it in each of the query, key and value projections; dit_attention casts
    it once, to the same dtype, for the same result bit for bit."""
    dit = matmul_copy(amplify_dit(OmniToken2WavAdapter(omni_dir)).dit, torch.float16)
    attn = dit.transformer_blocks[0].attn
    frames = 2 * dit.block_size
    hidden = torch.randn(
        2, frames, attn.to_q.in_features, generator=torch.Generator().manual_seed(5)
    )
    cos, sin = dit.rotary_embed(hidden, torch.arange(frames).repeat(2, 1))
    mask = torch.rand(2, attn.heads, frames, frames, generator=torch.Generator().manual_seed(6))
    mask = mask > 0.3
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.float16):
        with OpCounter() as theirs:
            want = attn(hidden_states=hidden, position_embeddings=(cos, sin), attention_mask=mask)
        with OpCounter() as ours:
            got = dit_attention(attn, hidden, (cos, sin), mask)
    assert hidden.dtype == torch.float32 and torch.equal(got, want)
    casts = theirs.ops["_to_copy"] + theirs.ops["to"], ours.ops["_to_copy"] + ours.ops["to"]
    assert casts[0] - casts[1] == 2, (theirs.ops, ours.ops)
