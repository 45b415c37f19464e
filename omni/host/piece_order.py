"""PieceOrder: a stage host's streaming requests and the upstream pieces still to hand over.

Ray's call threads do not keep the driver's calls in order, so a piece (`RoutedDelta`) may arrive
before its request's first input or before the piece ahead of it. Pieces are released strictly in
upstream order (by `offset`, the upstream tokens sent before each), each exactly once, and only for
requests that have started; a request's bookkeeping ends with its last piece, or when it ends.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence

from omni.messages import RoutedDelta

ENDED_IDS_KEPT = 10_000  # late pieces of this many recently ended requests are dropped


class PieceOrder:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next_offset: dict[str, int] = {}  # started request -> offset of its next piece
        self._early: dict[str, dict[int, RoutedDelta]] = {}
        self._ended: OrderedDict[str, None] = OrderedDict()

    def start(self, request_id: str, offset: int) -> None:
        """The request's first input covered `offset` upstream tokens; its pieces may flow."""
        with self._lock:
            self._next_offset[request_id] = offset

    def ready(
        self, pieces: list[RoutedDelta], started_ids: Sequence[str] = ()
    ) -> list[RoutedDelta]:
        """Every piece (of these, and those held back for their requests or for the requests
        that just started) that is next in its request's order."""
        out = []
        with self._lock:
            pieces = [p for p in pieces if p.request_id not in self._ended]
            for piece in pieces:
                self._early.setdefault(piece.request_id, {})[piece.offset] = piece
            waiting = {piece.request_id for piece in pieces} | set(started_ids)
            for request_id in waiting & self._early.keys():
                early = self._early[request_id]
                while (offset := self._next_offset.get(request_id, -1)) in early:
                    piece = early.pop(offset)
                    out.append(piece)
                    if piece.piece.finished:
                        del self._next_offset[request_id]
                    else:
                        self._next_offset[request_id] = offset + len(piece.piece.token_ids)
                if not early:
                    del self._early[request_id]
        return out

    def end(self, request_id: str) -> None:
        """The request finished, failed or was aborted: forget it and drop its held pieces."""
        with self._lock:
            self._next_offset.pop(request_id, None)
            self._early.pop(request_id, None)
            self._ended[request_id] = None
            while len(self._ended) > ENDED_IDS_KEPT:
                self._ended.popitem(last=False)

    def __len__(self) -> int:
        with self._lock:
            return len(self._next_offset) + len(self._early)
