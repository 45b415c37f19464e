"""TokenText: a token id's text and its bytes, as OpenAI's logprobs show each token.

The text is `tokenizer.decode([id])` with special tokens kept (so an alternative such as
"<|im_end|>" is named, not shown as ""). The bytes are the token's own: byte-level BPE
vocabularies (GPT-2's alphabet: Qwen, Llama 3, SmolLM) map each character of the token back to
its byte, so a token holding part of a UTF-8 character gets its real bytes, where its text is a
replacement character. Other vocabularies give the UTF-8 of the text.
"""

from __future__ import annotations

from typing import Any


class TokenText:
    def __init__(self, tokenizer: Any) -> None:
        from transformers.convert_slow_tokenizer import bytes_to_unicode

        self.tokenizer = tokenizer
        self._byte_of = {char: byte for byte, char in bytes_to_unicode().items()}
        self._cache: dict[int, tuple[str, list[int]]] = {}

    def __call__(self, token_id: int) -> tuple[str, list[int]]:
        """(text, bytes) of one token id (memoized: a vocabulary's tokens recur)."""
        known = self._cache.get(token_id)
        if known is not None:
            return known
        text = self.tokenizer.decode([token_id], skip_special_tokens=False)
        piece = self.tokenizer.convert_ids_to_tokens(token_id)
        special = token_id in getattr(self.tokenizer, "all_special_ids", ())
        byte_of = self._byte_of
        if isinstance(piece, str) and piece and not special and all(c in byte_of for c in piece):
            raw = [byte_of[c] for c in piece]
        else:
            raw = list(text.encode("utf-8"))
        self._cache[token_id] = (text, raw)
        return text, raw
