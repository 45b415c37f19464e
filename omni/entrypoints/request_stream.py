"""The driver -> caller channel of a request: snapshots pushed on the driver thread, awaited on
the caller's event loop.

Every engine step advances up to max_num_seqs requests, and each gets a snapshot. Waking the
event loop once per snapshot (`call_soon_threadsafe` writes to the loop's self-pipe) cost the
driver ~15 us per request per step and the loop one wakeup each, all under the GIL that the
stage threads need between their GPU steps. So snapshots for one loop go through its `Outbox`:
the first of a batch schedules one flush, the rest only append; and the driver routes a step's
events as one batch of deliveries (omni/driver/deliveries.py), so the flush is scheduled once the
whole step's snapshots are in, not as soon as the first is (the loop would flush it at once and
the next snapshot schedule another).
"""

from __future__ import annotations

import asyncio
import threading
import weakref

from omni.driver.deliveries import defer_wake
from omni.messages import OmniOutput


class Outbox:
    """Snapshots for one event loop, handed over in batches: one wakeup per batch."""

    _by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Outbox] = (
        weakref.WeakKeyDictionary()
    )
    _by_loop_lock = threading.Lock()

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = weakref.ref(loop)  # weak: a strong one would keep its _by_loop entry alive
        self._lock = threading.Lock()
        self._items: list[tuple[RequestStream, OmniOutput]] = []

    @classmethod
    def of(cls, loop: asyncio.AbstractEventLoop) -> Outbox:
        with cls._by_loop_lock:
            outbox = cls._by_loop.get(loop)
            if outbox is None:
                outbox = cls._by_loop[loop] = cls(loop)
            return outbox

    def push(self, stream: RequestStream, output: OmniOutput) -> None:
        """Called on the driver thread: the loop is woken at the end of the driver's batch of
        snapshots (omni/driver/deliveries.py), or now outside one."""
        with self._lock:
            self._items.append((stream, output))
            if len(self._items) > 1:
                return  # a flush is already scheduled and will take this one too
        if not defer_wake(self._wake):
            self._wake()

    def _wake(self) -> None:
        loop = self._loop()
        try:
            if loop is None:
                raise RuntimeError("the caller's event loop is gone")
            loop.call_soon_threadsafe(self._flush)
        except RuntimeError:  # the caller's loop is closed: nobody is listening any more
            with self._lock:
                self._items.clear()

    def _flush(self) -> None:
        with self._lock:
            items, self._items = self._items, []
        for stream, output in items:
            stream.put(output)


class RequestStream:
    """One request's snapshots. They are cumulative, so a caller that falls behind gets only the
    newest one: nothing queues up, nothing is lost."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._outbox = Outbox.of(loop)
        self._latest: OmniOutput | None = None
        self._ready = asyncio.Event()
        self.finished = False

    def push(self, output: OmniOutput) -> None:
        """Called on the driver thread."""
        self._outbox.push(self, output)

    def put(self, output: OmniOutput) -> None:
        """On the caller's loop: a finished snapshot is never replaced by a later one."""
        if self._latest is None or not self._latest.finished:
            self._latest = output
        self._ready.set()

    async def get(self) -> OmniOutput:
        await self._ready.wait()
        self._ready.clear()
        output, self._latest = self._latest, None
        assert output is not None
        self.finished = output.finished
        return output
