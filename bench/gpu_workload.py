"""The workload of bench/gpu.py: prompts of exact lengths (random ordinary tokens, seeded, so
that no two requests share a KV block), sampling budgets and engine overrides per stage."""

from __future__ import annotations

import argparse
import math
from typing import Any

import numpy as np

from omni import SamplingParams

SEED = 0  # DiT noise seed of every request


def chat_ids(tokenizer: Any, num_tokens: int, key: tuple[int, ...]) -> list[int]:
    """A user turn in Qwen's chat framing, exactly num_tokens long: random ordinary tokens
    (seeded by `key`, so prompts differ from their first block on and never hit the prefix
    cache of another) between `<|im_start|>user\\n` and `<|im_end|>\\n<|im_start|>assistant\\n`."""
    head = tokenizer.encode("<|im_start|>user\n", add_special_tokens=False)
    tail = tokenizer.encode("<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    body = num_tokens - len(head) - len(tail)
    if body < 1:
        raise SystemExit(f"--prompt-tokens {num_tokens} is too short for the chat framing")
    return head + random_ids(tokenizer, body, key) + tail


def random_ids(tokenizer: Any, n: int, key: tuple[int, ...]) -> list[int]:
    """n ordinary (non-special) token ids, seeded by key."""
    ordinary = min(tokenizer.all_special_ids or [len(tokenizer)])
    return np.random.default_rng(list(key)).integers(0, ordinary, n).tolist()


def omni_params(args: argparse.Namespace) -> list[SamplingParams]:
    return [
        SamplingParams(max_tokens=args.text_tokens, ignore_eos=True),
        SamplingParams(max_tokens=args.codec_tokens, stop_token_ids=args.fam.codec_eos),
        SamplingParams(max_tokens=1, seed=SEED),
    ]


def blocks_for(num_seqs: int, tokens: int, block_size: int = 16) -> int:
    """KV blocks for num_seqs sequences of `tokens` tokens, with a quarter to spare."""
    return math.ceil(num_seqs * math.ceil((tokens + 1) / block_size) * 1.25) + 16


def engine_overrides(args: argparse.Namespace, stages: tuple[str, ...]) -> dict[str, Any]:
    """Device, dtype and memory share of each stage (bf16 on a GPU; float32 on the CPU, as the
    stage configs say); Qwen2.5-Omni's token2wav keeps float32, as transformers runs it."""
    overrides: dict[str, Any] = {"runtime": {"backend": "local"}}
    shares = dict(zip(args.fam.stages, args.gpu_mem, strict=True))
    for stage in stages:
        overrides[f"stages.{stage}.engine.device"] = args.device
        if args.device == "cuda":
            share = shares.get(stage, args.gpu_mem[0])
            overrides[f"stages.{stage}.engine.gpu_memory_utilization"] = share
            if not (args.fam.vocoder_fp32 and stage == args.fam.stages[2]):
                overrides[f"stages.{stage}.engine.dtype"] = "bfloat16"
    return overrides
