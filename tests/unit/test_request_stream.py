"""The driver -> caller channel: snapshots pushed from another thread reach the caller's loop in
batches (one loop wakeup per batch, not per snapshot), the newest wins, a finished one stays."""

from __future__ import annotations

import asyncio
import threading

from omni.driver import deliveries
from omni.entrypoints.request_stream import Outbox, RequestStream
from omni.messages import OmniOutput


def snapshot(n: int, finished: bool = False) -> OmniOutput:
    return OmniOutput(request_id=f"s{n}", stages={}, final=None, finished=finished)  # type: ignore[arg-type]


def counted_wakeups(loop: asyncio.AbstractEventLoop) -> list:
    """The callbacks scheduled on `loop` from other threads (its wake-ups), from now on."""
    wakeups = []
    original = loop.call_soon_threadsafe

    def counted(callback, *args):
        wakeups.append(callback)
        return original(callback, *args)

    loop.call_soon_threadsafe = counted  # type: ignore[method-assign]
    return wakeups


def test_many_pushes_wake_the_loop_once_and_each_stream_gets_its_newest():
    async def main() -> None:
        loop = asyncio.get_running_loop()
        streams = [RequestStream(loop) for _ in range(64)]
        assert Outbox.of(loop) is streams[0]._outbox is streams[-1]._outbox
        wakeups = counted_wakeups(loop)

        def driver() -> None:  # one engine step's snapshots, then a second one
            for step in (1, 2):
                for i, stream in enumerate(streams):
                    stream.push(snapshot(100 * step + i, finished=step == 2 and i == 0))

        thread = threading.Thread(target=driver)
        thread.start()
        thread.join()
        got = [await asyncio.wait_for(s.get(), 5) for s in streams]
        assert [o.request_id for o in got] == [f"s{200 + i}" for i in range(64)]
        assert len(wakeups) == 1  # the loop never ran between the pushes: one flush took all
        assert got[0].finished and streams[0].finished and not streams[1].finished
        streams[1].push(snapshot(999))  # after the flush: a new batch, a new wakeup
        assert (await asyncio.wait_for(streams[1].get(), 5)).request_id == "s999"
        assert len(wakeups) == 2

    asyncio.run(main())


def test_a_finished_snapshot_is_never_replaced():
    async def main() -> None:
        stream = RequestStream(asyncio.get_running_loop())
        stream.put(snapshot(1, finished=True))
        stream.put(snapshot(2))
        assert (await stream.get()).request_id == "s1"

    asyncio.run(main())


def test_a_push_after_the_callers_loop_closed_is_dropped():
    loop = asyncio.new_event_loop()
    stream = RequestStream(loop)
    loop.close()
    stream.push(snapshot(1))  # no exception on the driver thread
    assert stream._outbox._items == []


def test_a_closed_loop_is_not_kept_alive_by_its_outbox():
    import gc
    import weakref

    loop = asyncio.new_event_loop()
    Outbox.of(loop)
    gone = weakref.ref(loop)
    loop.close()
    del loop
    gc.collect()
    assert gone() is None


def test_a_driver_batch_wakes_the_loop_once_at_its_end():
    """Inside the driver's batch (omni/driver/deliveries.py) the flush is scheduled when the
    batch ends, with every snapshot in: a loop that ran between pushes (while a snapshot's build
    let go of the GIL) flushed one and was woken again for the next, several times a step."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        streams = [RequestStream(loop) for _ in range(3)]
        wakeups = counted_wakeups(loop)
        with deliveries.batch():
            for i, stream in enumerate(streams):
                stream.push(snapshot(i))
                assert wakeups == []  # deferred to the batch's end
        assert len(wakeups) == 1
        got = [await asyncio.wait_for(s.get(), 5) for s in streams]
        assert [o.request_id for o in got] == ["s0", "s1", "s2"]
        streams[0].push(snapshot(7))  # outside a batch (a caller's own thread): at once
        assert len(wakeups) == 2
        assert not deliveries.defer_wake(lambda: None)

    asyncio.run(main())
