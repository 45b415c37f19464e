"""Deliveries: the driver thread's batches of snapshots, so that a listener wakes once per batch.

A sink (a caller's `RequestStream.push`) that would wake another thread, e.g. an asyncio loop
through `call_soon_threadsafe` (a write to its self-pipe, which also lets go of the GIL), may
instead defer that wake-up to the end of the batch it is called in (`defer_wake`): the driver
routes a step's events inside `batch()`, so a step that advances 64 requests wakes the caller's
loop once, not once for every snapshot the loop got to before the next was pushed. Outside a
batch (a caller adding or aborting a request on its own thread) nothing is deferred.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

_local = threading.local()


@contextmanager
def batch() -> Iterator[None]:
    """Wake-ups deferred inside run once each at the end, in the order first deferred."""
    pending: dict[Callable[[], None], None] = {}
    outer, _local.pending = getattr(_local, "pending", None), pending
    try:
        yield
    finally:
        _local.pending = outer
        for wake in pending:
            wake()


def defer_wake(wake: Callable[[], None]) -> bool:
    """Run `wake` at the end of this thread's batch: True, or False outside any batch (the
    caller wakes its listener now)."""
    pending = getattr(_local, "pending", None)
    if pending is None:
        return False
    pending[wake] = None
    return True
