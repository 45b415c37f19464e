"""How long a token2wav request may be to decode whole; longer ones are decoded in windows.

transformers' DiT attends with a dense mask: per forward it builds `block_diff` [frames, frames]
(int64, 8 bytes a cell) and per layer a boolean mask [2, heads, frames, frames] (the two rows of
classifier-free guidance), which torch's sdpa turns into a float additive mask of the same shape
and pads for alignment. So a whole decode holds about 8 * frames^2 + MASK_BYTES_PER_CELL * 2 *
heads * frames^2 bytes at its peak, with frames = codes * repeats: ~34 GB of boolean mask alone
at the DiT's 32,768 positions. `whole_decode_bytes` is that estimate (tests/cuda checks it bounds
the measured peak); a request whose estimate exceeds the adapter's budget
(`WHOLE_DECODE_BUDGET_BYTES` unless given) is decoded in windows instead, through the streaming
path (token2wav_chunks.py), whose masks are bounded by the window: the same speech up to the
bounded context's error (docs/streaming.md measures it).
"""

from __future__ import annotations

MASK_BYTES_PER_CELL = 10
"""Bytes per [2, heads, frames, frames] cell at a layer's peak: the boolean mask, the temporary
of its second comparison (or its negation in sdpa), sdpa's float32 additive mask and its copy
padded to an aligned row."""
WHOLE_DECODE_BUDGET_BYTES = 4 << 30
"""The default bound on a whole decode's masks: at 16 heads and 2 frames a code, 1,809 codes
(about 36 s of speech at 50 codes/s)."""
MIN_WINDOW_CODES = 50
"""The least codes a window emits (the streaming path's default chunk_size)."""


def whole_decode_bytes(num_codes: int, *, repeats: int, num_heads: int) -> int:
    """The estimated peak bytes of the DiT's masks when num_codes are decoded whole."""
    frames = num_codes * repeats
    return (8 + MASK_BYTES_PER_CELL * 2 * num_heads) * frames * frames


def max_whole_decode_codes(*, repeats: int, num_heads: int, budget_bytes: int) -> int:
    """The most codes whose whole decode stays within budget_bytes (0 if none does)."""
    if budget_bytes < 0:
        raise ValueError(f"budget_bytes must be >= 0, got {budget_bytes}")
    low, high = 0, 1
    while whole_decode_bytes(high, repeats=repeats, num_heads=num_heads) <= budget_bytes:
        low, high = high, high * 2
    while high - low > 1:  # whole_decode_bytes(low) fits, (high) does not
        mid = (low + high) // 2
        if whole_decode_bytes(mid, repeats=repeats, num_heads=num_heads) <= budget_bytes:
            low = mid
        else:
            high = mid
    return low


def window_codes(max_whole: int, left_context: int, look_ahead: int) -> int:
    """Codes each window emits when a request is decoded in windows: as many as fit in the
    budget beside the window's context (max_whole codes in all), at least MIN_WINDOW_CODES."""
    return max(MIN_WINDOW_CODES, max_whole - left_context - look_ahead)
