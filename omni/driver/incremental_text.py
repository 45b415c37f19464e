"""Text of a growing token list at O(new tokens) per step, for streamed snapshots.

Decoding the whole list after every step costs O(n) each time, O(n^2) per request. Instead only a
short window is decoded: the tokens since `prefix_offset` (a few tokens of context, so that
merges across the boundary decode right), compared with the same window without the tokens not
yet in the text. The window's start stays put for up to MAX_WINDOW tokens, so the text of the
window without the new tokens is the previous step's decode: one decode per step, not two (the
driver does this for every running request at every step). Text is appended only once it no
longer ends in an incomplete character (U+FFFD: a multi-byte character split across tokens). A
finished stage's text is always a full decode (the router's `_with_text`), so any difference in
whitespace cleanup never reaches a final result.
"""

from __future__ import annotations

from collections.abc import Callable

Decode = Callable[[list[int]], str | None]


MAX_WINDOW = 16  # tokens a window may span before its start moves up


class IncrementalText:
    def __init__(self) -> None:
        self.text = ""
        self._prefix_offset = 0  # context tokens start here
        self._read_offset = 0  # tokens before this are in `text`
        self._prefix_text: str | None = ""  # decode of [prefix_offset, read_offset); None: unknown

    def update(self, token_ids: list[int], decode: Decode) -> str | None:
        """The text of all of token_ids so far (None when the stage's tokens are not text)."""
        prefix = self._prefix_text
        if prefix is None:
            prefix = decode(token_ids[self._prefix_offset : self._read_offset])
        full = decode(token_ids[self._prefix_offset :])
        if prefix is None or full is None:
            return None
        self._prefix_text = prefix
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            self.text += full[len(prefix) :]
            if len(token_ids) - self._prefix_offset > MAX_WINDOW:
                # Context: the tokens read last time; its text is decoded at the next update.
                self._prefix_offset, self._prefix_text = self._read_offset, None
            else:
                self._prefix_text = full  # the same window start: the next prefix
            self._read_offset = len(token_ids)
        return self.text
