"""Token masks for structured output: which token ids may come next so that a reply stays JSON of
its schema (omni/core/json_grammar.py), over one stage's vocabulary.

`TokenBytes` is the vocabulary as bytes (special tokens never appear inside JSON: None).
`JsonConstraint` is one schema over one vocabulary: the mask of a grammar state, kept per state
(packed bits, least recently used first out, and so handed to the sampler: 8x fewer bytes to
stack and upload per step), since a reply revisits few states and every request with the same
schema revisits the same ones. A mask is computed by running candidate tokens' bytes through the
grammar: inside a string, tokens without a quote, a backslash or a control byte only add
characters (allowed within the string's length bound, by their counts), so only the others are
run (a few percent of a vocabulary); elsewhere only tokens whose first two bytes the state
takes. `JsonCursor` is one request's place: the state after its tokens so far, and its stop
tokens (EOS, stop_token_ids), allowed once the value is whole and only then.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence

import numpy as np

from omni.core.json_grammar import State, initial, is_complete, step
from omni.core.json_schema import Node

_PLAIN = np.array([b >= 0x20 and b not in b'"\\' for b in range(256)])


class TokenBytes:
    def __init__(self, token_bytes: Sequence[bytes | None], vocab_size: int) -> None:
        """token_bytes: each token id's bytes (None: a special token); vocab_size: the logits'
        width (ids past token_bytes are never allowed)."""
        self.vocab_size = vocab_size
        self.tokens: list[bytes | None] = list(token_bytes[:vocab_size])
        self.tokens += [None] * (vocab_size - len(self.tokens))
        self.plain = np.zeros(vocab_size, dtype=bool)  # stays inside a string
        self.chars = np.zeros(vocab_size, dtype=np.int64)  # a plain token's characters
        # By their first two bytes (None: a one-byte token), so that a state runs a token only
        # when it takes both: most of a vocabulary dies on its second byte anywhere but in a
        # string (" the" where a value may start: the space is taken, "t" is not).
        by_first: dict[int, dict[int | None, list[int]]] = {}
        self.unplain_ids: list[int] = []
        for token_id, data in enumerate(self.tokens):
            if not data:
                continue
            second = data[1] if len(data) > 1 else None
            by_first.setdefault(data[0], {}).setdefault(second, []).append(token_id)
            raw = np.frombuffer(data, dtype=np.uint8)
            if _PLAIN[raw].all():
                self.plain[token_id] = True
                self.chars[token_id] = np.count_nonzero((raw < 0x80) | (raw >= 0xC0))
            else:
                self.unplain_ids.append(token_id)
        self.by_first = by_first


class JsonConstraint:
    def __init__(self, root: Node, vocab: TokenBytes, max_cached: int = 1024) -> None:
        self.root = root
        self.vocab = vocab
        self.max_cached = max_cached
        self._masks: OrderedDict[State, np.ndarray] = OrderedDict()
        self._steps: dict[tuple[State, int], State | None] = {}
        self.num_computed = 0  # masks computed (not found cached)

    def cursor(self, stop_ids: Iterable[int]) -> JsonCursor:
        return JsonCursor(self, stop_ids)

    def packed(self, state: State) -> np.ndarray:
        """The tokens that keep `state` on the way to a whole value (stop tokens not included),
        as np.packbits of bool[vocab_size]: read-only, shared by every request in the state."""
        packed = self._masks.get(state)
        if packed is None:
            if len(self._steps) > 200_000:  # the byte steps memo, bounded
                self._steps.clear()
            packed = np.packbits(self._compute(state))
            packed.flags.writeable = False
            self._masks[state] = packed
            if len(self._masks) > self.max_cached:
                self._masks.popitem(last=False)
        else:
            self._masks.move_to_end(state)
        return packed

    def advance(self, state: State | None, token_id: int) -> State | None:
        data = self.vocab.tokens[token_id] if 0 <= token_id < self.vocab.vocab_size else None
        if state is None or not data:
            return None
        for byte in data:
            state = self._step(state, byte)
            if state is None:
                return None
        return state

    def _step(self, state: State, byte: int) -> State | None:
        key = (state, byte)
        if key in self._steps:
            return self._steps[key]
        after = self._steps[key] = step(state, byte)
        return after

    def _compute(self, state: State) -> np.ndarray:
        self.num_computed += 1
        vocab = self.vocab
        top = state[-1]
        if top[0] == "S" and top[1] == 0:  # inside a string: plain tokens only add characters
            high = top[4]
            mask = (
                vocab.plain.copy() if high is None else vocab.plain & (vocab.chars <= high - top[2])
            )
            candidates: Iterable[int] = vocab.unplain_ids
        else:
            mask = np.zeros(vocab.vocab_size, dtype=bool)
            candidates = []
            for first, by_second in vocab.by_first.items():
                after = self._step(state, first)
                if after is None:
                    continue
                for second, token_ids in by_second.items():
                    if second is None or self._step(after, second) is not None:
                        candidates += token_ids
        tokens = vocab.tokens
        for token_id in candidates:
            current: State | None = state
            for byte in tokens[token_id] or b"":
                current = self._step(current, byte)  # type: ignore[arg-type]
                if current is None:
                    break
            else:
                mask[token_id] = True
        return mask


class JsonCursor:
    """One request's place in its JSON: advanced by each token it generates."""

    def __init__(self, constraint: JsonConstraint, stop_ids: Iterable[int]) -> None:
        self.constraint = constraint
        self.stop_ids = np.array(sorted(set(stop_ids)), dtype=np.int64)
        self.state: State | None = initial(constraint.root)

    @property
    def complete(self) -> bool:
        return self.state is not None and is_complete(self.state)

    def advance(self, token_id: int) -> None:
        if self.complete and token_id in self.stop_ids:
            return  # ignore_eos went past a stop token: the value stays whole
        self.state = self.constraint.advance(self.state, token_id)

    def replay(self, token_ids: Sequence[int]) -> None:
        """Back to the start, then through token_ids (outputs dropped or rewritten)."""
        self.state = initial(self.constraint.root)
        for token_id in token_ids:
            self.advance(token_id)

    def packed(self) -> np.ndarray:
        """np.packbits of bool[vocab_size]: the tokens the next sample may take; stop tokens
        only once the value is whole (and when nothing else can go on: a token outside the
        grammar got in). Shared with the constraint's cache unless stop tokens were added."""
        vocab_size = self.constraint.vocab.vocab_size
        if self.state is None:
            packed = np.zeros(-(-vocab_size // 8), dtype=np.uint8)
        else:
            packed = self.constraint.packed(self.state)
            if not is_complete(self.state) and packed.any():
                return packed
            packed = packed.copy()
        stops = self.stop_ids[self.stop_ids < vocab_size]
        np.bitwise_or.at(packed, stops >> 3, (0x80 >> (stops & 7)).astype(np.uint8))
        return packed

    def allowed(self) -> np.ndarray:
        """The same as bool[vocab_size]."""
        return np.unpackbits(self.packed(), count=self.constraint.vocab.vocab_size).view(bool)
