"""Writing freshly computed keys and values into the paged KV cache."""

import torch


def reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Copy token i's key/value into slot ``slot_mapping[i]`` of the caches, in place.

    key/value: [num_tokens, num_kv_heads, head_dim]; caches: [num_blocks, block_size, num_kv_heads,
    head_dim]; slot = block_id * block_size + offset. Every slot must be valid (no -1 padding) and
    distinct within one call. One indexed copy per cache, no Python loop over tokens.
    """
    if key.shape != value.shape or key.dim() != 3:
        raise ValueError(
            f"key/value must both be [num_tokens, num_kv_heads, head_dim], got "
            f"{tuple(key.shape)} and {tuple(value.shape)}"
        )
    if slot_mapping.shape != (key.shape[0],):
        raise ValueError(
            f"slot_mapping has shape {tuple(slot_mapping.shape)}, expected ({key.shape[0]},)"
        )
    # The caches must be contiguous so that the flat view aliases them: a copy would drop writes.
    if not (key_cache.is_contiguous() and value_cache.is_contiguous()):
        raise RuntimeError("key_cache and value_cache must be contiguous")
    num_kv_heads, head_dim = key_cache.shape[2], key_cache.shape[3]
    flat_keys = key_cache.view(-1, num_kv_heads, head_dim)
    flat_values = value_cache.view(-1, num_kv_heads, head_dim)
    flat_keys.index_copy_(0, slot_mapping, key.to(key_cache.dtype))
    flat_values.index_copy_(0, slot_mapping, value.to(value_cache.dtype))
