"""Text of a growing token list at O(new tokens) per step, for streamed snapshots.

Decoding the whole list after every step costs O(n) each time, O(n^2) per request. Instead only a
short window is decoded: the tokens since `prefix_offset` (a few tokens of context, so that
merges across the boundary decode right), compared with the same window without the new tokens.
Text is appended only once it no longer ends in an incomplete character (U+FFFD: a multi-byte
character split across tokens). A finished stage's text is always a full decode (the router's
`_with_text`), so any difference in whitespace cleanup never reaches a final result.
"""

from __future__ import annotations

from collections.abc import Callable

Decode = Callable[[list[int]], str | None]


class IncrementalText:
    def __init__(self) -> None:
        self.text = ""
        self._prefix_offset = 0  # context tokens start here
        self._read_offset = 0  # tokens before this are in `text`

    def update(self, token_ids: list[int], decode: Decode) -> str | None:
        """The text of all of token_ids so far (None when the stage's tokens are not text)."""
        prefix = decode(token_ids[self._prefix_offset : self._read_offset])
        full = decode(token_ids[self._prefix_offset :])
        if prefix is None or full is None:
            return None
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            self.text += full[len(prefix) :]
            self._prefix_offset = self._read_offset
            self._read_offset = len(token_ids)
        return self.text
