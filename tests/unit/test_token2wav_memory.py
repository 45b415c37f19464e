"""The whole-decode bound of token2wav (stages/qwen2_5_omni/token2wav_memory.py) on injected
budgets: the DiT masks' estimate, the longest request decoded whole within a budget, and the
windows a longer one is decoded in."""

from __future__ import annotations

import pytest

from stages.qwen2_5_omni.token2wav_memory import (
    MIN_WINDOW_CODES,
    WHOLE_DECODE_BUDGET_BYTES,
    max_whole_decode_codes,
    whole_decode_bytes,
    window_codes,
)

SEVEN_B = {"repeats": 2, "num_heads": 16}  # Qwen2.5-Omni-7B's DiT


def test_whole_decode_bytes_grows_with_the_square_of_the_frames():
    # 1,000 codes = 2,000 frames: int64 block_diff + 10 bytes per cell of [2, 16, T, T].
    assert whole_decode_bytes(1000, **SEVEN_B) == (8 + 10 * 2 * 16) * 2000**2 == 1_312_000_000
    assert whole_decode_bytes(2000, **SEVEN_B) == 4 * whole_decode_bytes(1000, **SEVEN_B)
    # The DiT's 32,768 positions whole: the boolean masks alone are ~34 GB, all of it ~352 GB.
    assert 2 * 16 * 32768**2 == 34_359_738_368
    assert whole_decode_bytes(16384, **SEVEN_B) > 350e9


@pytest.mark.parametrize("budget", [0, 327, 328 * 4, 10**9, WHOLE_DECODE_BUDGET_BYTES, 10**12])
def test_max_whole_decode_codes_is_the_last_that_fits(budget):
    codes = max_whole_decode_codes(**SEVEN_B, budget_bytes=budget)
    assert codes == 0 or whole_decode_bytes(codes, **SEVEN_B) <= budget
    assert whole_decode_bytes(codes + 1, **SEVEN_B) > budget


def test_the_default_budget_and_bad_budgets():
    assert max_whole_decode_codes(**SEVEN_B, budget_bytes=WHOLE_DECODE_BUDGET_BYTES) == 1809
    assert max_whole_decode_codes(**SEVEN_B, budget_bytes=328 * 4) == 1  # 2 frames: 328 * 4
    with pytest.raises(ValueError, match="budget_bytes must be >= 0, got -1"):
        max_whole_decode_codes(**SEVEN_B, budget_bytes=-1)


def test_windows_fill_the_budget_beside_their_context():
    assert window_codes(1809, 25, 25) == 1759
    assert window_codes(60, 25, 25) == MIN_WINDOW_CODES  # never fewer than a streamed chunk
    assert window_codes(0, 0, 0) == MIN_WINDOW_CODES
