"""Tiny Qwen2 / Llama causal LMs with random weights that give decisive greedy choices.

Why a custom initialisation: HF's default (normal, std 0.02) makes random models' logits almost
flat, so the top-1/top-2 margin is often below float32 reordering noise (~1e-6) and a paged
attention kernel that sums in a different order could flip the greedy token. We instead scale every
matrix by fan-in (std = gain / sqrt(fan_in)), which keeps each layer's output O(1) at any width,
give the embeddings std 1 so that the current token stays visible in the residual stream (less
collapse into one repeated token), and scale the LM head so that logits have std ``LOGIT_STD``.
The initialisation walks the state dict in sorted name order with one seeded generator, so it is
independent of module construction order and of transformers' own init code.
"""

from __future__ import annotations

import math
import pathlib

import torch

# gain for hidden matrices: >1 makes attention scores and MLP activations less uniform.
HIDDEN_GAIN = 1.5
# Logit std of the LM head. Measured over 800 greedy steps (8 prompts x 100) on the tiny models:
# top-1/top-2 margin min 2.5e-3..3e-3, median 0.8..0.9; bench: min 1.3e-3, median 0.7..0.9.
LOGIT_STD = 4.0
BIAS_STD = 0.1

SIZES = {
    # tiny: ~100 k parameters besides the embeddings, builds in well under a second.
    "tiny": dict(
        vocab_size=512,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        max_position_embeddings=4096,
    ),
    # bench: about 27 M parameters, in line with the 32 M reference in ENV-FACTS.
    "bench": dict(
        vocab_size=2048,
        hidden_size=512,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=4,
        intermediate_size=1536,
        max_position_embeddings=4096,
    ),
}


def init_lm_weights(model: torch.nn.Module, seed: int, names: list[str] | None = None) -> None:
    """Overwrite parameters deterministically (see module docstring for the reasons).

    ``names``: restrict to these state-dict keys (used for the text parts of Qwen2.5-Omni).
    """
    gen = torch.Generator().manual_seed(seed)
    params = dict(model.named_parameters())
    for name in sorted(names if names is not None else params):
        p = params[name]
        with torch.no_grad():
            if p.ndim == 1 and name.endswith("weight"):
                p.fill_(1.0)  # RMSNorm scales
            elif p.ndim == 1:
                p.copy_(torch.randn(p.shape, generator=gen) * BIAS_STD)
            elif "embed_tokens" in name or "embedding" in name:
                p.copy_(torch.randn(p.shape, generator=gen))
            elif name.endswith(("lm_head.weight", "codec_head.weight")):
                p.copy_(torch.randn(p.shape, generator=gen) * (LOGIT_STD / math.sqrt(p.shape[1])))
            else:
                std = HIDDEN_GAIN / math.sqrt(p.shape[1])
                p.copy_(torch.randn(p.shape, generator=gen) * std)


def build_lm(family: str, size: str, seed: int, out_dir: pathlib.Path) -> int:
    """Write config, generation config, tokenizer and safetensors weights; return #params."""
    from transformers import (
        GenerationConfig,
        LlamaConfig,
        LlamaForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    from tools import tiny_tokenizer

    dims = SIZES[size]
    if family == "qwen2":
        tok = tiny_tokenizer.save_qwen2_tokenizer(
            out_dir, dims["vocab_size"], ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        )
        bos_id = None
        eos_id = tok.convert_tokens_to_ids("<|endoftext|>")
        config = Qwen2Config(
            **dims, rope_theta=10000.0, use_sliding_window=False, bos_token_id=eos_id
        )
        cls = Qwen2ForCausalLM
    else:
        tok = tiny_tokenizer.save_llama_tokenizer(out_dir, dims["vocab_size"])
        bos_id = tok.bos_token_id
        eos_id = tok.eos_token_id
        config = LlamaConfig(**dims, rope_theta=10000.0, bos_token_id=bos_id)
        cls = LlamaForCausalLM
    if len(tok) != dims["vocab_size"]:
        raise RuntimeError(f"tokenizer has {len(tok)} tokens, model vocab is {dims['vocab_size']}")
    config.eos_token_id = eos_id
    config.pad_token_id = eos_id
    config.tie_word_embeddings = False
    config.initializer_range = HIDDEN_GAIN / math.sqrt(dims["hidden_size"])  # informational
    config.dtype = "float32"
    torch.manual_seed(seed)  # HF's init runs first; every value is then overwritten below
    model = cls(config).eval()
    init_lm_weights(model, seed)
    model.save_pretrained(str(out_dir))
    GenerationConfig(
        bos_token_id=bos_id if bos_id is not None else eos_id,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
        do_sample=False,
    ).save_pretrained(str(out_dir))
    return sum(p.numel() for p in model.parameters())
