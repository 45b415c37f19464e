"""omni/core/json_constraint.py: a state's token mask equals running every token's bytes through
the grammar (brute force, no shortcuts), at every state along JSON texts tokenized greedily over
a synthetic vocabulary (every byte, plus multi-byte tokens with quotes, backslashes, digits and
whitespace in them); stop tokens are allowed only once the value is whole; masks are computed
once per state."""

from __future__ import annotations

import numpy as np
import pytest

from omni.core.json_constraint import JsonConstraint, TokenBytes
from omni.core.json_grammar import step
from omni.core.json_schema import compile_schema

MULTI = [b'{"', b'":', b'": ', b'",', b'", "', b'"}', b"}}", b'\\"', b"\\n", b"ab", b" a",
         b'a"', b"12", b"3.", b".5", b"e-", b"true", b"null", b"  ", b"\n  ", b"],", b"[{",
         b'"name"', b'"age', b"\xc3\xa9", b"\xc3", b"\xa9x", b"a\x01"]  # fmt: skip
SPECIAL, EOS = 300, 301
VOCAB = [bytes([b]) for b in range(256)] + MULTI
VOCAB_SIZE = 310  # logits are wider than the tokenizer: ids past it are never allowed


def vocabulary() -> TokenBytes:
    tokens: list[bytes | None] = list(VOCAB) + [None] * (SPECIAL + 2 - len(VOCAB))
    return TokenBytes(tokens, VOCAB_SIZE)


def greedy_tokens(text: bytes) -> list[int]:
    ids, i = [], 0
    while i < len(text):
        best = max(
            (t for t, v in enumerate(VOCAB) if text.startswith(v, i)), key=lambda t: len(VOCAB[t])
        )
        ids.append(best)
        i += len(VOCAB[best])
    return ids


def brute_force(state, vocab: TokenBytes) -> np.ndarray:
    mask = np.zeros(vocab.vocab_size, dtype=bool)
    for token_id, data in enumerate(vocab.tokens):
        current = state
        for byte in data or b"":
            current = step(current, byte)
            if current is None:
                break
        mask[token_id] = bool(data) and current is not None
    return mask


SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "number"},
                   "tags": {"type": "array", "items": {"type": "string"}}},
    "required": ["name", "age"],
}  # fmt: skip
TEXTS = [
    (None, b'{"name": "J\\"o\xc3\xa9", "age": 12.5e-3, "tags": ["ab", "a\\n"]}'),
    (None, b'{\n  "age": 3,\n  "name": "x"\n}'),
    ({}, b'[{"a": [true, null, -0.5]}, "s", 12]'),
    ({"type": "object"}, b'{"k": {"n": [1, 2]}, "t": "ab"}'),
    ({"type": "array", "maxItems": 3, "items": {"type": "string", "minLength": 1, "maxLength": 4}},
     b'["ab", "\xc3\xa9ab", "a\\n\\"b"]'),
]  # fmt: skip


@pytest.mark.parametrize(("schema", "text"), TEXTS)
def test_masks_equal_brute_force_at_every_state(schema, text):
    vocab = vocabulary()
    constraint = JsonConstraint(compile_schema(SCHEMA if schema is None else schema), vocab)
    cursor = constraint.cursor([EOS])
    for token_id in greedy_tokens(text):
        mask = cursor.allowed()
        assert cursor.state is not None
        expected = brute_force(cursor.state, vocab)
        assert not cursor.complete and not mask[EOS]  # stop tokens only once the value is whole
        np.testing.assert_array_equal(mask, expected, err_msg=repr(cursor.state))
        assert mask[token_id] and not mask[SPECIAL] and not mask[VOCAB_SIZE - 1]
        cursor.advance(token_id)
    assert cursor.complete
    end = cursor.allowed()
    assert end[EOS] and end.sum() == 1  # whole: only a stop token may follow
    cursor.advance(EOS)  # ignore_eos goes past it: still whole
    assert cursor.complete


def test_masks_are_computed_once_per_state_and_replay_matches():
    constraint = JsonConstraint(compile_schema(SCHEMA), vocabulary())
    ids = greedy_tokens(TEXTS[0][1])
    first = constraint.cursor([EOS])
    for token_id in ids:
        first.allowed()
        first.advance(token_id)
    computed = constraint.num_computed
    second = constraint.cursor([EOS])
    for token_id in ids:
        second.allowed()
        second.advance(token_id)
    assert constraint.num_computed == computed  # every state's mask was cached
    third = constraint.cursor([EOS])
    third.replay(ids)
    assert third.state == first.state == second.state


def test_a_token_outside_the_grammar_leaves_only_stops():
    cursor = JsonConstraint(compile_schema(SCHEMA), vocabulary()).cursor([EOS, 7])
    cursor.advance(ord("["))  # not an object
    assert cursor.state is None
    mask = cursor.allowed()
    assert mask.sum() == 2 and mask[EOS] and mask[7]


def test_a_small_cache_evicts_the_least_recent_states():
    constraint = JsonConstraint(compile_schema(SCHEMA), vocabulary(), max_cached=2)
    cursor = constraint.cursor([EOS])
    for token_id in greedy_tokens(TEXTS[0][1])[:6]:
        np.testing.assert_array_equal(cursor.allowed(), brute_force(cursor.state, constraint.vocab))
        cursor.advance(token_id)
    assert len(constraint._masks) == 2


@pytest.mark.parametrize("copy", [True, False])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("num_masked", [3, 2])
def test_the_sampler_masks_the_logits_rows(copy, dtype, num_masked):
    import torch

    from omni.runtime.sampler import masked

    rng = np.random.default_rng(0)
    logits = torch.randn(3, 13).to(getattr(torch, dtype))  # a width not a multiple of 8
    given = logits.clone()
    allowed = [rng.random(13) < 0.5, None, rng.random(13) < 0.5]
    if num_masked == 3:
        allowed[1] = rng.random(13) < 0.5
    out = masked(logits, [None if a is None else np.packbits(a) for a in allowed], copy=copy)
    for row, mask in enumerate(allowed):
        expected = given[row]
        if mask is not None:
            expected = expected.masked_fill(~torch.from_numpy(mask), float("-inf"))
        torch.testing.assert_close(out[row], expected, rtol=0, atol=0)
    assert (out is logits) is not copy
    if copy:
        torch.testing.assert_close(logits, given, rtol=0, atol=0)  # the model's own logits
    assert masked(logits, [None, None, None], copy=copy) is logits


def test_min_tokens_cuts_the_stops_from_the_json_mask_until_only_a_stop_may_follow():
    from omni.core.request import Request
    from omni.core.sampling_params import SamplingParams

    allowed = np.ones(VOCAB_SIZE, dtype=bool)
    allowed[EOS] = False
    params = SamplingParams(max_tokens=10, min_tokens=5, json_schema={"type": "object"})
    request = Request("r", [1, 2], sampling_params=params, eos_token_id=EOS)
    request.stop_mask = np.packbits(allowed)
    request.constraint = JsonConstraint(compile_schema({"type": "object"}), vocabulary()).cursor(
        [EOS]
    )
    for token in greedy_tokens(b"{"):  # inside the value: the stop cut, the rest as JSON's
        request.append_output_token_ids(token)
        mask = np.unpackbits(request.allowed_tokens())[:VOCAB_SIZE].astype(bool)
        assert not mask[EOS] and mask.sum() > 1
    request.append_output_token_ids(greedy_tokens(b"}"))
    assert request.num_output_tokens < 5  # a whole value before min_tokens: only a stop, as JSON
    mask = np.unpackbits(request.allowed_tokens())[:VOCAB_SIZE].astype(bool)
    assert mask.sum() == 1 and mask[EOS]
    plain = Request("p", [1], sampling_params=SamplingParams(min_tokens=2), eos_token_id=EOS)
    plain.stop_mask = request.stop_mask
    assert plain.allowed_tokens() is plain.stop_mask
    plain.append_output_token_ids([3, 4])
    assert plain.allowed_tokens() is None  # min_tokens reached: any token
