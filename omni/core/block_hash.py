"""Chained block hashes over full blocks: hash(parent hash, block token ids, extra keys).

Hashes are bytes computed from a compact, fixed byte encoding, so they are identical across
processes and runs (nothing depends on Python's `hash()` or PYTHONHASHSEED).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable
from typing import TypeAlias

import xxhash

from omni.core.request import Request

BlockHash: TypeAlias = bytes
ExtraKeys: TypeAlias = tuple[tuple[str | int, ...], ...]
"""A block's extra keys: ("mm", identifier, offset), ("lora", id), ("salt", s), ("gen", key)."""

# Parent of the first block of every sequence. Fixed forever: changing it invalidates nothing
# in memory but would make hashes differ from earlier runs.
ROOT_PARENT_HASH: BlockHash = b"omni.prefix.root"


def _sha256(data: bytes) -> BlockHash:
    return hashlib.sha256(data).digest()


HASH_FUNCTIONS: dict[str, Callable[[bytes], BlockHash]] = {
    "xxhash": xxhash.xxh3_128_digest,  # 128-bit XXH3
    "sha256": _sha256,
}


def get_hash_function(hash_algo: str) -> Callable[[bytes], BlockHash]:
    try:
        return HASH_FUNCTIONS[hash_algo]
    except KeyError:
        raise ValueError(
            f"hash_algo must be one of {sorted(HASH_FUNCTIONS)}, got {hash_algo!r}"
        ) from None


def block_extra_keys(request: Request, block_index: int, block_size: int) -> ExtraKeys:
    """What besides token ids makes the block's KV unique.

    Every multimodal input overlapping the block as (identifier, its offset relative to the block
    start); the LoRA id on every block; the cache salt on the first block only (the chain carries it
    to all later blocks); the generation key on every block holding a generated token.
    """
    start = block_index * block_size
    end = start + block_size
    keys: list[tuple[str | int, ...]] = []
    for item in request.mm_inputs:  # sorted by offset
        if item.offset >= end:
            break
        if item.offset + item.length > start:
            keys.append(("mm", item.identifier, item.offset - start))
    if request.lora_id is not None:
        keys.append(("lora", request.lora_id))
    if block_index == 0 and request.cache_salt is not None:
        keys.append(("salt", request.cache_salt))
    if request.generation_key is not None and end > request.num_prompt_tokens:
        keys.append(("gen", request.generation_key))
    return tuple(keys)


def encode_extra_keys(extra_keys: ExtraKeys) -> bytes:
    """Length-prefixed encoding so that no two different key tuples share bytes."""
    out = bytearray()
    for key in extra_keys:
        for part in key:
            data = str(part).encode() if not isinstance(part, int) else struct.pack("<q", part)
            tag = b"i" if isinstance(part, int) else b"s"
            out += tag + struct.pack("<I", len(data)) + data
        out += b";"
    return bytes(out)


def hash_request_blocks(request: Request, block_size: int, hash_algo: str) -> list[BlockHash]:
    """Extend the request's memo to cover all its full blocks; returns the block hashes.

    The memo holds each full block's hash and its token ids as bytes (`block_token_bytes`, what
    exact matching compares). It depends only on the request's tokens and keys, which only ever
    grow, so it is extended incrementally.
    """
    if request.block_hash_algo != hash_algo or request.block_hash_size != block_size:
        request.block_hashes = []
        request.block_token_bytes = []
        request.block_hash_algo = hash_algo
        request.block_hash_size = block_size
    hashes = request.block_hashes
    num_full_blocks = request.num_known_tokens // block_size  # provisional tokens: never hashed
    if len(hashes) >= num_full_blocks:
        return hashes
    hash_fn = get_hash_function(hash_algo)
    first = len(hashes)
    # Encode the new blocks' tokens once; each block hashes a slice of this buffer.
    new_token_ids = request.all_token_ids[first * block_size : num_full_blocks * block_size]
    token_bytes = struct.pack(f"<{len(new_token_ids)}I", *new_token_ids)
    width = 4 * block_size
    parent = hashes[-1] if hashes else ROOT_PARENT_HASH
    keys = request.block_token_bytes
    for index in range(first, num_full_blocks):
        offset = (index - first) * width
        block_bytes = token_bytes[offset : offset + width]
        keys.append(block_bytes)
        data = parent + block_bytes
        extras = block_extra_keys(request, index, block_size) if request.has_block_extras else ()
        if extras:
            data += b"\xff" + encode_extra_keys(extras)
        parent = hash_fn(data)
        hashes.append(parent)
    return hashes
