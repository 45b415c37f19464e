"""gc_freeze: a started pipeline freezes the process's objects out of full collections; each
shutdown unfreezes, and refreezes while other pipelines of the process still serve."""

from __future__ import annotations

import gc
import weakref

import pytest

from omni.backends import gc_freeze


@pytest.fixture
def no_pipeline_live():
    """Run with no other pipeline of this process counted (a worker may hold one), and leave
    the process as it was found."""
    saved = gc_freeze._num_live
    gc_freeze._num_live = 0
    gc.unfreeze()
    yield
    gc_freeze._num_live = saved
    gc.unfreeze()
    if saved:
        gc.freeze()


def _tracked(obj: object) -> bool:
    """Whether the collector walks obj (gc.get_objects leaves frozen objects out)."""
    return any(o is obj for o in gc.get_objects())


class _Cycle:
    def __init__(self) -> None:
        self.me = self


def test_start_freezes_and_the_last_shutdown_unfreezes(no_pipeline_live):
    garbage = weakref.ref(_Cycle())  # start-up garbage in a cycle: collected, not frozen
    kept = _Cycle()
    gc_freeze.freeze_started()
    assert gc_freeze.num_live() == 1 and gc.get_freeze_count() > 0
    assert garbage() is None and not _tracked(kept)  # kept is frozen: full collections skip it
    made_while_serving = _Cycle()
    assert _tracked(made_while_serving)
    gc_freeze.release()
    assert gc_freeze.num_live() == 0 and gc.get_freeze_count() == 0
    assert _tracked(kept)  # back under the collector


def test_a_shutdown_refreezes_what_the_other_pipelines_hold(no_pipeline_live):
    first_pipeline = _Cycle()  # held while the first pipeline serves: frozen with it
    gc_freeze.freeze_started()
    gc_freeze.freeze_started()
    leftover = weakref.ref(first_pipeline)
    del first_pipeline  # its shutdown leaves it as cyclic garbage, frozen
    gc.collect()
    assert leftover() is not None  # a frozen cycle outlives collections
    gc_freeze.release()
    assert gc_freeze.num_live() == 1 and gc.get_freeze_count() > 0
    assert leftover() is None  # collected before the refreeze
    gc_freeze.release()
    gc_freeze.release()  # one more than started: never below zero
    assert gc_freeze.num_live() == 0 and gc.get_freeze_count() == 0
