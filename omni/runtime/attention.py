"""The transformers attention hook that reads and writes the paged KV cache.

The model runner packs every scheduled token of every request into one row (batch 1), passes
explicit position_ids, use_cache=False and ``omni_attn=AttentionMetadata(...)`` to the model.
transformers hands that kwarg unchanged to the registered attention function of every layer, with
attention_mask None (no mask function is registered under our name): causality and sequence
boundaries come from the metadata alone.

On a CUDA device (with triton importable) attention is one Triton kernel launch per layer
(kernels/triton_paged_attention.py) that reads the block tables itself: no per-request plan is
made and AttentionMetadata.build does no device-to-host sync. Everywhere else the torch path of
kernels/paged_attention.py runs with a plan built once per step.
"""

from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import AttentionInterface

from kernels.cache_ops import reshape_and_cache
from kernels.paged_attention import PagedAttentionPlan, make_plan, paged_attention
from kernels.triton_paged_attention import HAVE_TRITON, triton_paged_attention

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
    max_seq_len: int | None = None  # None: not known on the host (sliding-window check only)
    # A bound of every seq_lens entry known on the host (a CUDA graph's: max_model_len): with
    # it, the Triton kernel splits the keys of a grid too small for the GPU (kernels/split_kv).
    max_context: int | None = None
    # Derived device tensors the Triton kernel computes at the first layer and reuses after.
    kernel_cache: dict[tuple[str, int], torch.Tensor] = field(default_factory=dict)
    # Pure decode batches only: arange(num_seqs + 1) int32, the Triton kernel's tile table.
    decode_tile_starts: torch.Tensor | None = None

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
        max_context: int | None = None,
    ) -> "AttentionMetadata":
        """Metadata for every layer of the step. With the caches on a CUDA device and triton
        importable, the index tensors go to that device (no-op when already there) and no plan
        is built: the Triton kernel needs none, and nothing here waits for the device.
        Otherwise the torch path's plan is precomputed once here. max_context: the step's
        longest sequence, where the caller knows it on the host (else computed when it can)."""
        slot_mapping = torch.as_tensor(slot_mapping, dtype=torch.int64)
        query_start_loc = torch.as_tensor(query_start_loc, dtype=torch.int64)
        seq_lens = torch.as_tensor(seq_lens, dtype=torch.int64)
        block_tables = torch.as_tensor(block_tables, dtype=torch.int64)
        if block_tables.dim() != 2:
            raise ValueError(
                f"block_tables must be [num_seqs, max_blocks], got {tuple(block_tables.shape)}"
            )
        on_host = query_start_loc.device.type == "cpu" and seq_lens.device.type == "cpu"
        max_seq_len = None
        if on_host:  # both checks read values: on a device they would wait for it
            num_tokens = int(query_start_loc[-1])
            if slot_mapping.shape != (num_tokens,):
                raise ValueError(
                    f"slot_mapping has {slot_mapping.numel()} entries, "
                    f"query_start_loc says {num_tokens} tokens"
                )
            max_seq_len = int(seq_lens.max()) if seq_lens.numel() else 0
        if kv_caches and uses_triton(kv_caches[0][0].device):
            device = kv_caches[0][0].device
            slot_mapping, query_start_loc, seq_lens, block_tables = (
                t.to(device, non_blocking=True)
                for t in (slot_mapping, query_start_loc, seq_lens, block_tables)
            )
            plan = None
        else:
            plan = make_plan(block_tables, seq_lens, query_start_loc, block_size)
        if max_context is None:
            max_context = max_seq_len
        return cls(
            slot_mapping,
            query_start_loc,
            seq_lens,
            block_tables,
            kv_caches,
            plan,
            max_seq_len,
            max_context=max_context,
        )


def uses_triton(device: torch.device) -> bool:
    """Whether attention on this device runs the Triton kernel (CUDA with triton installed)."""
    return device.type == "cuda" and HAVE_TRITON


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
    key_cache, value_cache = meta.kv_caches[module.layer_idx]
    triton_path = uses_triton(query.device)
    plan = meta.plan
    if plan is None and not triton_path:
        plan = meta.plan = make_plan(
            meta.block_tables, meta.seq_lens, meta.query_start_loc, key_cache.shape[1]
        )
    window = kwargs.get("sliding_window")
    if window is not None:
        max_seq_len = plan.max_seq_len if plan is not None else meta.max_seq_len
        if max_seq_len is None:  # metadata on the device: one sync, remembered for the step
            max_seq_len = meta.max_seq_len = int(meta.seq_lens.max()) if len(meta.seq_lens) else 0
        if max_seq_len > window:
            raise NotImplementedError(f"sliding window {window} < context {max_seq_len}")
    # [1, H, T, D] -> [T, H, D]: views only; the kernels gather/copy what they need.
    query_rows = query[0].transpose(0, 1)
    if not kwargs.get("omni_kv_cached"):  # else a fused rotary kernel wrote them already
        k_rows, v_rows = key[0].transpose(0, 1), value[0].transpose(0, 1)
        reshape_and_cache(k_rows, v_rows, key_cache, value_cache, meta.slot_mapping)
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    if triton_path:
        out = triton_paged_attention(
            query_rows,
            key_cache,
            value_cache,
            meta.block_tables,
            meta.seq_lens,
            meta.query_start_loc,
            scaling,
            step_cache=meta.kernel_cache,
            tile_starts=meta.decode_tile_starts,
            max_context=meta.max_context,
        )
    else:
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
    device: torch.device | str | None = None,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Zeroed (key_cache, value_cache) per layer, each [num_blocks, block_size, Hkv, head_dim],
    on `device` (None: the CPU).

    Zeros, not empty: attention reads whole blocks (and padding blocks) before masking, and
    uninitialised memory may hold NaN, which survives a zero softmax weight (0 * NaN = NaN).
    """
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    return [
        (
            torch.zeros(shape, dtype=dtype, device=device),
            torch.zeros(shape, dtype=dtype, device=device),
        )
        for _ in range(num_layers)
    ]
