"""JsonOutputs: one stage's structured output (SamplingParams.json_schema): its vocabulary as bytes,
read from the checkpoint's tokenizer when the first request asks for JSON, and one
JsonConstraint per schema (omni/core/json_constraint.py), shared by every request with it, so
that their token masks are computed once.

Token bytes: byte-level BPE vocabularies (GPT-2's alphabet: Qwen, Llama 3, SmolLM) map each
character of a token back to its byte; SentencePiece pieces map "▁" to a space and "<0xNN>" to
byte NN; special tokens have none (they never appear inside JSON).
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from typing import Any

from omni.core.json_constraint import JsonConstraint, JsonCursor, TokenBytes
from omni.core.json_schema import compile_schema
from omni.core.sampling_params import SamplingParams
from omni.engine.prompt_processor import load_tokenizer

_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")
MAX_SCHEMAS = 64
"""Schemas kept with their masks (least recently used out): a server whose every request
brings a schema of its own holds at most this many (each up to JsonConstraint.max_cached
masks of vocab_size / 8 bytes)."""


def token_bytes(tokenizer: Any) -> list[bytes | None]:
    """Each token id's bytes, None for special tokens."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    byte_of = {char: byte for byte, char in bytes_to_unicode().items()}
    special = set(getattr(tokenizer, "all_special_ids", ())) | set(
        getattr(tokenizer, "added_tokens_decoder", {})
    )
    out: list[bytes | None] = []
    for token_id, piece in enumerate(tokenizer.convert_ids_to_tokens(range(len(tokenizer)))):
        if token_id in special or not isinstance(piece, str) or not piece:
            out.append(None)
        elif all(c in byte_of for c in piece):
            out.append(bytes(byte_of[c] for c in piece))
        elif match := _BYTE_PIECE.fullmatch(piece):
            out.append(bytes([int(match.group(1), 16)]))
        else:
            out.append(piece.replace("\u2581", " ").encode())
    return out


class JsonOutputs:
    def __init__(self, model_dir: str, vocab_size: int, eos_token_id: int | None) -> None:
        self.model_dir = model_dir
        self.vocab_size = vocab_size
        self.eos_token_id = eos_token_id
        self._vocab: TokenBytes | None = None
        # The schemas seen last (each with its masks); an evicted one lives on in its cursors.
        self._constraints: OrderedDict[str, JsonConstraint] = OrderedDict()
        self.num_computed_evicted = 0  # masks computed for schemas no longer kept
        self._lock = threading.Lock()  # add_request may come from the host's thread and a test's

    def cursor(self, params: SamplingParams) -> JsonCursor | None:
        """The request's place in its JSON (None: params ask for no JSON); a ValueError when
        the stage has no tokenizer to read token bytes from, or no stop token to end with."""
        schema = params.json_schema
        if schema is None:
            return None
        with self._lock:
            constraint = self._constraints.get(schema)
            if constraint is None:
                root = compile_schema(json.loads(schema))
                constraint = self._constraints[schema] = JsonConstraint(root, self._vocabulary())
                if len(self._constraints) > MAX_SCHEMAS:
                    _, evicted = self._constraints.popitem(last=False)
                    self.num_computed_evicted += evicted.num_computed
            self._constraints.move_to_end(schema)
        eos = [] if self.eos_token_id is None else [self.eos_token_id]
        stops = [*params.stop_token_ids, *eos]
        if not stops:  # a whole value could never end the reply
            raise ValueError("json_schema: the model has no EOS token; give stop_token_ids")
        return constraint.cursor(stops)

    def _vocabulary(self) -> TokenBytes:
        if self._vocab is None:
            tokenizer = load_tokenizer(self.model_dir)
            if tokenizer is None:
                raise ValueError(
                    f"json_schema: {self.model_dir!r} has no tokenizer to constrain tokens with"
                )
            self._vocab = TokenBytes(token_bytes(tokenizer), self.vocab_size)
        return self._vocab

    def stats(self) -> dict[str, int]:
        return {
            "json_schemas": len(self._constraints),
            "json_masks_computed": self.num_computed_evicted
            + sum(c.num_computed for c in self._constraints.values()),
        }
