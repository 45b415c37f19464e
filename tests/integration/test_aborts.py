"""Aborts stop a request in every stage at once: `await engine.abort(request_id)`, leaving the
`async for` early and cancelling the task, on both backends, for streamed and whole-sequence
requests, caught in the thinker, in the talker, or while the vocoder decodes its chunks.

Each request could decode for 200 more steps when it is aborted. Once the driver has dropped it,
no stage may take more than one more step (the one in flight; on Ray, plus the abort's delivery
to the actor), every stage must be empty with no KV block in use, and then the pipeline must stay
idle: no step at all for half a second.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest
from helpers import OMNI_ON_CPU, OMNI_STAGES

from omni import AsyncOmni, OmniOutput
from omni.core.sampling_params import SamplingParams

pytestmark = pytest.mark.slow

LONG = SamplingParams(max_tokens=200, ignore_eos=True)
VOCODER = SamplingParams(max_tokens=1, seed=3)
# Where the abort lands: the stage parameters, whether the request streams, and the first
# snapshot that shows it there.
WHERE: dict[str, tuple[list[SamplingParams], bool, Callable[[OmniOutput], bool]]] = {
    "thinker": ([LONG, LONG, VOCODER], False, lambda out: True),
    "thinker-streamed": ([LONG, LONG, VOCODER], True, lambda out: True),
    "talker": (
        [SamplingParams(max_tokens=4, ignore_eos=True), LONG, VOCODER],
        False,
        lambda out: "talker" in out.stages,
    ),
    "vocoder-chunks": (
        [LONG, LONG, VOCODER],
        True,
        lambda out: "token2wav" in out.stages and out.stages["token2wav"].audio is not None,
    ),
}
MAX_STEPS_AFTER_ABORT = 1  # the step a stage may have been taking when the abort came
# On Ray the abort reaches a stage actor as a fire-and-forget call after the driver dropped the
# request; on a loaded 2-core machine that delivery took up to 6 steps of the tiny thinker. Far
# fewer than the ~190 steps a request that is not stopped would still take.
RAY_DELIVERY_STEPS = 20
SETTLE_S = 20.0


@pytest.fixture(
    scope="module",
    params=["local", pytest.param("ray", marks=pytest.mark.ray)],
)
def engine(request, omni_dir):
    runtime = {"backend": request.param}
    if request.param == "ray":
        request.getfixturevalue("ray_cluster")  # the session's cluster, connected
    engine = AsyncOmni(model=omni_dir, runtime=runtime, **OMNI_ON_CPU)
    yield engine
    engine.shutdown()


def _steps(stats: dict) -> dict[str, int]:
    return {stage: stats[stage]["steps"] for stage in OMNI_STAGES}


async def _abort_midway(engine: AsyncOmni, how: str, where: str) -> dict[str, int]:
    """Start a request, abort it `how` once it is `where`; each stage's steps once the driver has
    dropped it."""
    params, stream, ready = WHERE[where]
    request_id = f"{how}-{where}"
    reached = asyncio.Event()
    outputs: list[OmniOutput] = []

    async def consume() -> None:
        async for out in engine.generate(
            "tell me a long story", params, request_id=request_id, stream_audio=stream
        ):
            outputs.append(out)
            if not out.finished and ready(out):
                reached.set()
                if how == "leave":
                    break  # leaving the loop aborts the request

    task = asyncio.create_task(consume())
    await asyncio.wait_for(reached.wait(), 60)
    if how == "abort":
        assert await engine.abort(request_id)
        await asyncio.wait_for(task, 10)
        last = outputs[-1]
        assert last.finished and last.final.finish_reason == "aborted"
        assert last.error == f"request {request_id!r} was aborted"
    elif how == "cancel":
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    else:
        await asyncio.wait_for(task, 10)
        assert not outputs[-1].finished
    deadline = time.monotonic() + 10
    while engine.num_requests and time.monotonic() < deadline:  # "leave": the generator's close
        await asyncio.sleep(0.01)
    assert engine.num_requests == 0
    return _steps(engine.stats())


async def _settled(engine: AsyncOmni) -> dict:
    deadline = time.monotonic() + SETTLE_S
    while True:
        stats = engine.stats()
        busy = any(stats[s]["num_requests"] or stats[s].get("kv_blocks_in_use") for s in stats)
        if not busy or time.monotonic() > deadline:
            return stats
        await asyncio.sleep(0.02)


@pytest.mark.parametrize("where", list(WHERE))
@pytest.mark.parametrize("how", ["abort", "leave", "cancel"])
def test_an_abort_stops_every_stage_at_once(request, engine, how, where):
    async def main():
        dropped = await _abort_midway(engine, how, where)
        settled = await _settled(engine)
        await asyncio.sleep(0.5)
        return dropped, settled, engine.stats()

    dropped, settled, later = asyncio.run(main())
    for stage in OMNI_STAGES:
        assert settled[stage]["num_requests"] == 0, (stage, settled[stage])
        assert settled[stage].get("kv_blocks_in_use", 0) == 0, (stage, settled[stage])
    taken = {s: settled[s]["steps"] - dropped[s] for s in OMNI_STAGES}
    limit = MAX_STEPS_AFTER_ABORT
    if request.node.callspec.params["engine"] == "ray":
        limit += RAY_DELIVERY_STEPS
    assert all(n <= limit for n in taken.values()), taken
    assert _steps(later) == _steps(settled)  # idle: no step after the abort settled
