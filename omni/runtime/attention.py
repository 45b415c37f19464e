"""The transformers attention hook that reads and writes the paged KV cache.

The model runner packs every scheduled token of every request into one row (batch 1), passes
explicit position_ids, use_cache=False and ``omni_attn=AttentionMetadata(...)`` to the model.
transformers hands that kwarg unchanged to the registered attention function of every layer, with
attention_mask None (no mask function is registered under our name): causality and sequence
boundaries come from the metadata alone.
"""

from dataclasses import dataclass
from typing import Any

import torch
from transformers import AttentionInterface

from kernels.cache_ops import reshape_and_cache
from kernels.paged_attention import PagedAttentionPlan, make_plan, paged_attention

ATTENTION_NAME = "omni_paged"


@dataclass
class AttentionMetadata:
    """One model step's view of the paged cache; shared by all layers of that step."""

    slot_mapping: torch.Tensor  # [num_tokens] int64: cache slot of each fed token
    query_start_loc: torch.Tensor  # [num_seqs + 1] int64: sequence i owns rows [i]:[i + 1]
    seq_lens: torch.Tensor  # [num_seqs] int64: context length including the fed tokens
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int64
    kv_caches: list[tuple[torch.Tensor, torch.Tensor]]  # per layer: (key_cache, value_cache)
    plan: PagedAttentionPlan | None = None  # kernels.paged_attention.make_plan(...) result

    @classmethod
    def build(
        cls,
        *,
        slot_mapping: torch.Tensor,
        query_start_loc: torch.Tensor,
        seq_lens: torch.Tensor,
        block_tables: torch.Tensor,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        block_size: int,
    ) -> "AttentionMetadata":
        """Metadata with its attention plan precomputed once for every layer of the step."""
        slot_mapping = torch.as_tensor(slot_mapping, dtype=torch.int64)
        query_start_loc = torch.as_tensor(query_start_loc, dtype=torch.int64)
        seq_lens = torch.as_tensor(seq_lens, dtype=torch.int64)
        block_tables = torch.as_tensor(block_tables, dtype=torch.int64)
        if block_tables.dim() != 2:
            raise ValueError(
                f"block_tables must be [num_seqs, max_blocks], got {tuple(block_tables.shape)}"
            )
        num_tokens = int(query_start_loc[-1])
        if slot_mapping.shape != (num_tokens,):
            raise ValueError(
                f"slot_mapping has {slot_mapping.numel()} entries, "
                f"query_start_loc says {num_tokens} tokens"
            )
        plan = make_plan(block_tables, seq_lens, query_start_loc, block_size)
        return cls(slot_mapping, query_start_loc, seq_lens, block_tables, kv_caches, plan)


def paged_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Registered attention function: query [1, H, T, D], key/value [1, Hkv, T, D] (rotary applied,
    kv heads not repeated). Writes the new K/V into the layer's cache, then attends over the
    paged context. Returns ([1, T, H, D], None)."""
    meta = kwargs.get("omni_attn")
    if meta is None:
        raise RuntimeError(
            f"attention {ATTENTION_NAME!r} needs the step's AttentionMetadata: call "
            "model(..., omni_attn=AttentionMetadata.build(...), position_ids=..., use_cache=False)"
        )
    if query.shape[0] != 1:
        raise ValueError(
            f"{ATTENTION_NAME!r} expects one packed row (batch 1), got batch {query.shape[0]}"
        )
    plan = meta.plan
    if plan is None:
        block_size = meta.kv_caches[module.layer_idx][0].shape[1]
        plan = meta.plan = make_plan(
            meta.block_tables, meta.seq_lens, meta.query_start_loc, block_size
        )
    window = kwargs.get("sliding_window")
    if window is not None and plan.max_seq_len > window:
        raise NotImplementedError(f"sliding window {window} < context {plan.max_seq_len}")
    key_cache, value_cache = meta.kv_caches[module.layer_idx]
    # [1, H, T, D] -> [T, H, D]: views only; the kernels gather/copy what they need.
    query_rows = query[0].transpose(0, 1)
    reshape_and_cache(
        key[0].transpose(0, 1),
        value[0].transpose(0, 1),
        key_cache,
        value_cache,
        meta.slot_mapping,
    )
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    out = paged_attention(
        query_rows,
        key_cache,
        value_cache,
        meta.block_tables,
        meta.seq_lens,
        meta.query_start_loc,
        scaling,
        plan=plan,
    )
    return out.unsqueeze(0), None


def register_paged_attention() -> str:
    """Register the hook with transformers (idempotent); returns the name to select it by."""
    AttentionInterface.register(ATTENTION_NAME, paged_attention_forward)
    return ATTENTION_NAME


def allocate_kv_caches(
    num_layers: int,
    num_blocks: int,
    block_size: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Zeroed (key_cache, value_cache) per layer, each [num_blocks, block_size, Hkv, head_dim].

    Zeros, not empty: attention reads whole blocks (and padding blocks) before masking, and
    uninitialised memory may hold NaN, which survives a zero softmax weight (0 * NaN = NaN).
    """
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    return [
        (torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype))
        for _ in range(num_layers)
    ]
