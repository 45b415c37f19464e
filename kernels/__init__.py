"""Pure-torch kernels for the paged KV cache: writing new K/V into blocks and paged attention."""

from kernels.cache_ops import reshape_and_cache
from kernels.paged_attention import (
    PagedAttentionPlan,
    make_plan,
    paged_attention,
    paged_attention_reference,
)

__all__ = [
    "PagedAttentionPlan",
    "make_plan",
    "paged_attention",
    "paged_attention_reference",
    "reshape_and_cache",
]
