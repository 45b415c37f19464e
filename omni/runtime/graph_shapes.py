"""The fixed shapes (num_seqs, num_tokens) padded steps run at (omni/runtime/decode_graphs.py):
the decode batch ladder, the suffix sizes, the scratch KV blocks their padding writes to, and
which shapes get a second CUDA graph for long contexts (one whose attention splits its keys,
kernels/split_kv.py)."""

from __future__ import annotations

from kernels.split_kv import num_kv_splits, unsplit_context
from omni.runtime.stage_model import StageModel

SUFFIX_SIZES = (16, 32, 64, 128, 256)
Shape = tuple[int, int]  # (num_seqs, num_tokens)


def batch_ladder(max_batch: int) -> list[int]:
    """1, 2, 4, 8, then every multiple of 8 up to max_batch (which is always the last)."""
    sizes = [b for b in (1, 2, 4, 8) if b < max_batch]
    sizes += list(range(16, max_batch, 8))
    return [*sizes, max_batch]


def suffix_ladder(max_suffix_tokens: int) -> list[int]:
    """Suffix sizes up to min(max_num_batched_tokens, max_model_len): a step feeds no more, and
    the padding sequence's block table must fit the table width."""
    return [t for t in SUFFIX_SIZES if t <= max_suffix_tokens]


def max_suffix_tokens(model: StageModel, max_num_batched_tokens: int, max_model_len: int) -> int:
    """The longest suffix a step may pad (0: the model takes decode batches only)."""
    return min(max_num_batched_tokens, max_model_len) if model.decode_suffixes else 0


def num_scratch_blocks(max_batch: int, max_suffix_tokens: int, block_size: int) -> int:
    """KV blocks past the pool that hold the padding tokens' keys (one slot per padding row)."""
    return -(-max(max_batch, *suffix_ladder(max_suffix_tokens), 1) // block_size)


def splits_keys(shape: Shape, bound: int, num_kv_heads: int, num_sms: int) -> bool:
    """Whether a step of this shape with contexts up to `bound` (past unsplit_context()) splits
    its attention's keys, so that it needs a graph of its own; else the short graph serves it.
    A decode batch's grid is B x kv heads programs; a suffix's, a few tiles: always small."""
    num_seqs, num_tokens = shape
    if bound <= unsplit_context():
        return False
    if num_seqs != num_tokens:
        return True
    return num_kv_splits(num_seqs * num_kv_heads, bound, num_sms) > 1
