"""Start-up objects kept out of the cyclic garbage collector's way while pipelines serve.

CPython's full (generation 2) collection walks every object it tracks. Once torch, transformers
and a pipeline's stages are loaded that is ~390k objects: a ~190 ms pause on a 2-core CPU during
which every thread of the process stops (each stage of the local backend, the driver, the
caller's event loop), since the collector holds the GIL. Serving promotes enough request objects
to set one off soon after start-up and then every so often under load (bench/gc_pauses.py). As vLLM does after its start-up, a process
that has built its stages collects once and freezes (`gc.freeze`): what exists then moves to a
permanent generation that collections skip, while what serving creates is collected as before.

Freezing is process-wide, and a process may hold several pipelines (tests, notebooks): each
start freezes; each shutdown unfreezes, so that what the pipeline leaves in reference cycles can
be collected, and freezes again, after a collection, what the process's other live pipelines
hold.
"""

from __future__ import annotations

import gc
import threading

_lock = threading.Lock()
_num_live = 0  # pipelines (or stage actors) of this process that froze and are not shut down


def freeze_started() -> None:
    """This process's stages are built: collect the start-up's garbage, freeze the rest."""
    global _num_live
    with _lock:
        _num_live += 1
        gc.collect()
        gc.freeze()


def release() -> None:
    """A pipeline that froze has shut down: unfreeze; refreeze what the others still hold."""
    global _num_live
    with _lock:
        _num_live = max(_num_live - 1, 0)
        gc.unfreeze()
        if _num_live:
            gc.collect()
            gc.freeze()


def num_live() -> int:
    """Pipelines of this process that froze and have not shut down."""
    return _num_live
