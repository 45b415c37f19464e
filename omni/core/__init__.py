"""Torch-free bookkeeping: requests, block hashing, the block pool, the KV cache manager, the
scheduler. Imports only the standard library, numpy and xxhash."""

from omni.core.block_hash import ROOT_PARENT_HASH, hash_request_blocks
from omni.core.kv_cache_manager import KVCacheManager
from omni.core.prefix_cache_stats import PrefixCacheStats
from omni.core.request import MultiModalInput, Request, RequestStatus
from omni.core.sampling_params import SamplingParams

__all__ = [
    "ROOT_PARENT_HASH",
    "KVCacheManager",
    "MultiModalInput",
    "PrefixCacheStats",
    "Request",
    "RequestStatus",
    "SamplingParams",
    "hash_request_blocks",
]
