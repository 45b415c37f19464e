"""IncrementalText: streamed text equals the full decode, one token at a time, multi-byte too."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from omni.driver.incremental_text import MAX_WINDOW, IncrementalText

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Café crème, naïve façade — 中文字符 and an emoji 🎉 in the middle.",
    "  leading spaces,\nnew lines\tand tabs  ",
]


@pytest.fixture(scope="module")
def tokenizer(qwen2_dir):
    return AutoTokenizer.from_pretrained(qwen2_dir)


@pytest.mark.parametrize("text", TEXTS)
def test_streamed_text_is_a_growing_prefix_of_the_full_decode(tokenizer, text):
    token_ids = tokenizer.encode(text, add_special_tokens=False)
    full = tokenizer.decode(token_ids, skip_special_tokens=True)
    stream = IncrementalText()
    seen = []
    for n in range(1, len(token_ids) + 1):
        seen.append(stream.update(token_ids[:n], lambda ids: tokenizer.decode(ids)))
    assert seen[-1] == full
    assert all(full.startswith(s) and "\ufffd" not in s for s in seen)
    assert seen == sorted(seen, key=len)


def test_non_text_stages_stay_none():
    assert IncrementalText().update([1, 2, 3], lambda ids: None) is None


def test_the_decoder_of_a_plain_fast_tokenizer_equals_transformers_decode(tokenizer, llama_dir):
    """text_decoder goes straight to the Rust backend where that gives transformers' text, and
    falls back to `decode` where it would not (space cleanup asked for)."""
    import random

    from omni.engine.prompt_processor import text_decoder

    for tok in (tokenizer, AutoTokenizer.from_pretrained(llama_dir)):
        decode = text_decoder(tok)
        assert decode.__code__.co_freevars == ("backend",)  # the fast path was taken
        rng = random.Random(0)
        for _ in range(200):  # special tokens included: skipped alike
            ids = [rng.randrange(len(tok)) for _ in range(rng.randrange(12))]
            assert decode(ids) == tok.decode(ids, skip_special_tokens=True), ids
        for text in TEXTS:
            ids = tok.encode(text, add_special_tokens=False)
            assert decode(ids) == tok.decode(ids, skip_special_tokens=True)
    cleaning = AutoTokenizer.from_pretrained(llama_dir, clean_up_tokenization_spaces=True)
    assert text_decoder(cleaning).__code__.co_freevars == ("slow",)
    assert text_decoder(None)([1, 2]) is None


def test_a_long_stream_decodes_about_once_per_step(tokenizer):
    """Past several windows (MAX_WINDOW tokens each) the text is still the full decode, and a
    step costs one decode but where a window's start moves (two then)."""
    text = " ".join(TEXTS * 4)
    token_ids = tokenizer.encode(text, add_special_tokens=False)
    assert len(token_ids) > 5 * MAX_WINDOW
    calls = []

    def decode(ids):
        calls.append(len(ids))
        return tokenizer.decode(ids)

    stream = IncrementalText()
    for n in range(1, len(token_ids) + 1):
        got = stream.update(token_ids[:n], decode)
    assert got == tokenizer.decode(token_ids, skip_special_tokens=True)
    assert len(calls) <= len(token_ids) * (1 + 2 / MAX_WINDOW)
    assert max(calls) <= 2 * MAX_WINDOW  # windows stay short: O(new tokens) per step
