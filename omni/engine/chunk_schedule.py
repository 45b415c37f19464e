"""ChunkSchedule: which work a GenerationEngine step takes, and the chunks of its streams.

A streaming request (`Stream`: input_complete=False, its codes arriving as the upstream stage
generates them) is decoded in chunks: chunk k covers codes [b_k, b_{k+1}), b_0 = 0,
b_1 = stream.first_chunk_size, then the stream.ramp sizes, later chunks stream.chunk_size long
(StreamConfig.chunk_tokens), and is ready once its codes
and `look_ahead` more have come, or the input is complete (the last chunk takes what is left).
A step takes each stream's next ready chunk and the oldest whole request (`Work` items), or the
oldest whole requests where the engine batches them (`max_whole`), up to `engine.max_num_seqs`
of them ranked by chunk index, then arrival, and at most `engine.max_num_batched_tokens` codes in
all (null: 256 on the CPU, no bound on a GPU; a window counted with its context, a batch as its
longest window times its size, since shorter ones are padded to it; the chunks and the whole
requests are two batches): a request's
first audio goes ahead of other requests' later chunks, and a whole request counts as chunk 0.
Each decode also sees `left_context` codes before its chunk and the `look_ahead` after.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from omni.config import StageConfig
from omni.messages import InputDelta, StageInput
from omni.runtime.stage_model import ChunkedGenerationModel, GenerationModel


@dataclass
class Stream:
    """A streaming request's state: its codes so far and the chunks it has emitted."""

    stage_input: StageInput
    arrival: float
    order: int  # arrival order, shared with whole requests
    seed: int
    token_ids: list[int]
    input_complete: bool = False
    num_emitted_tokens: int = 0  # chunks cover [0, num_emitted_tokens)
    chunks: list[torch.Tensor] = field(default_factory=list)
    first_audio_s: float | None = None

    @property
    def done(self) -> bool:
        """All of its (complete) input has been decoded."""
        return self.input_complete and self.num_emitted_tokens == len(self.token_ids)


def extended_extras(extras: Mapping[str, Any], delta: InputDelta) -> dict[str, Any]:
    """A stream's extras with the delta's: per-token rows (one per new token, e.g. a codec
    frame's code groups) appended to the rows of the same name."""
    out = dict(extras)
    for key, rows in delta.extras.items():
        rows = np.asarray(rows)
        if rows.ndim == 0 or rows.shape[0] != len(delta.new_token_ids):
            raise ValueError(
                f"delta extras {key!r}: one row per new token expected "
                f"({len(delta.new_token_ids)}), got shape {list(rows.shape)}"
            )
        before = out.get(key)
        out[key] = rows if before is None or not len(before) else np.concatenate([before, rows])
    return out


@dataclass(frozen=True)
class Work:
    """One item of a step: a whole request (start == end == 0) or one chunk of a stream."""

    rank: tuple[int, int]  # (chunk index, arrival order): the order items are taken in
    request_id: str
    start: int = 0
    end: int = 0


class ChunkSchedule:
    def __init__(
        self, config: StageConfig, model: GenerationModel, max_whole: int, max_codes: int
    ) -> None:
        self.config = config
        self.model = model
        self.max_whole = max_whole  # whole requests per step: 1, or more decoded as one batch
        self.max_codes = max_codes  # engine.max_num_batched_tokens, resolved for the device

    def schedule(
        self, pending: Mapping[str, tuple[StageInput, float, int]], streams: Mapping[str, Stream]
    ) -> list[Work]:
        """The step's items: ready ones ranked (chunk index, arrival), at most max_num_seqs.
        pending: the whole requests, oldest first, as (input, arrival time, arrival order)."""
        # Unbatched, one whole-sequence decode per step: they would run one by one anyway, and
        # each waveform then leaves as soon as it is done instead of waiting for the others.
        whole = list(pending.items())[: self.max_whole]
        work = [Work((0, order), request_id) for request_id, (_, _, order) in whole]
        # A stream's next chunk only, even when more are ready: its audio then arrives chunk by
        # chunk instead of in one piece after a longer step; the batch is across requests.
        for request_id, stream in streams.items():
            work += [
                Work((i, stream.order), request_id, s, e)
                for i, s, e in self.ready_chunks(stream)[:1]
            ]
        ranked = sorted(work, key=lambda w: w.rank)[: self.config.engine.max_num_seqs]
        # A step decodes at most max_num_batched_tokens codes, so that it is short enough for a
        # new request's first chunk not to wait long behind it. The chunks of one batch are
        # padded to its longest window, and padding costs as much as codes: count it. The first
        # item is always taken, and no later one jumps the rank order to fit.
        taken: list[Work] = []
        whole_longest = num_whole = longest = num_chunks = 0
        for item in ranked:
            size = self.window_size(item, pending, streams)
            if item.end == 0:
                cost = (num_whole + 1) * max(whole_longest, size) + num_chunks * longest
            else:
                cost = num_whole * whole_longest + (num_chunks + 1) * max(longest, size)
            if taken and cost > self.max_codes:
                break
            taken.append(item)
            if item.end == 0:
                whole_longest, num_whole = max(whole_longest, size), num_whole + 1
            else:
                longest, num_chunks = max(longest, size), num_chunks + 1
        return taken

    def window_size(
        self,
        item: Work,
        pending: Mapping[str, tuple[StageInput, float, int]],
        streams: Mapping[str, Stream],
    ) -> int:
        """Codes one item decodes: a whole request's, or a chunk's with its context."""
        if item.end == 0:
            return len(pending[item.request_id][0].prompt_token_ids)
        left, ahead = self.context()
        num_tokens = len(streams[item.request_id].token_ids)
        return min(item.end + ahead, num_tokens) - max(item.start - left, 0)

    def ready_chunks(self, stream: Stream) -> list[tuple[int, int, int]]:
        """(chunk index, start, end) of each chunk of the stream that can be decoded now."""
        stream_config = self.config.stream
        look_ahead = self.context()[1]
        num_tokens = len(stream.token_ids)
        index, start, ready = len(stream.chunks), stream.num_emitted_tokens, []
        while start < num_tokens:
            end = start + stream_config.chunk_tokens(index)
            if end + look_ahead > num_tokens:  # its codes or look-ahead have not all come
                if not stream.input_complete:
                    break
                end = min(end, num_tokens)
            ready.append((index, start, end))
            index, start = index + 1, end
        return ready

    def context(self) -> tuple[int, int]:
        """(left_context, look_ahead): the stage config's, or the adapter's defaults."""
        left, ahead = self.config.stream.left_context, self.config.stream.look_ahead
        if left is None or ahead is None:
            # Only streams ask, and add_request admits a stream only for a chunked model.
            assert isinstance(self.model, ChunkedGenerationModel)
            default_left, default_ahead = self.model.chunk_defaults()
            left = default_left if left is None else left
            ahead = default_ahead if ahead is None else ahead
        return left, ahead
