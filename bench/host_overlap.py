"""Decode steps on the local backend with the GPU's time simulated: how much of a step the
stage thread loses to the other Python threads of the process (the driver, the caller's event
loop) through the GIL.

On the H200 (bench/gpu.py, docs/gpu.md) a B=16 decode step of the 0.5B layout took 2.56 ms with
1.10 ms of kernels, and the engine's own host work (schedule, prepare, sample, update) is about
0.2 ms: the rest is the stage thread waiting. Every torch call releases the GIL, and a thread
that wants it back waits until the holder blocks or its switch interval (5 ms by default) runs
out, so the driver's and the event loop's per-step Python work lands inside the stage's step.

This bench runs the real pipeline (AsyncOmni, local backend, the tiny qwen2 checkpoint as a
plain decoder stage on a thread of its own, as a GPU stage gets, CUDA-graph path padded) with
bench/host_step.py's stand-ins for the model body, its graphs and logits, and a simulated
device: a queue where each launched step takes --device-ms once the one before it is done, and
reading a step's ids (`LaunchedStep.result`, the real step's `.tolist()`) sleeps until it is
(a sleep releases the GIL as a CUDA wait does). B requests decode together, with each
`engine.async_scheduling` mode (--modes: sync, ahead) and each --switch-interval
(sys.setswitchinterval, seconds; 'default' keeps Python's). It reports the step period (p50 of
the time between StageEngine.step calls, over the steps where all B decode), the device busy
share it implies (device ms / period), and each thread's CPU time per step. Nothing is
asserted; on a shared 2-core machine the figures are indicative.

--snapshots final runs the requests without per-step snapshots (no streaming client: the driver
builds and detokenizes none), to see what streaming costs the stage thread.

--backend processes runs the stage in a process of its own (runtime.backend processes): the
stage's threads there are named "stage:<thread>". The stand-ins are installed in that process
when it imports this script (multiprocessing's spawn imports the parent's main module as
__mp_main__); the step starts and thread times come back through the stage's stats, and
--switch-interval sets the caller's process only. "tok/s" is
the level's B * --tokens over its wall time: with the stage in another process it may step
faster than the driver delivers, so the step period alone would flatter it.

    python bench/host_overlap.py [--batch 16,64] [--device-ms 1.1] [--tokens 200]
        [--modes sync,ahead] [--switch-interval default,0.0005] [--snapshots step|final]
        [--backend local,processes]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any, cast

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from host_step import StandIn, install_stand_in_graphs  # noqa: E402

from omni import AsyncOmni  # noqa: E402
from omni.core.sampling_params import SamplingParams  # noqa: E402
from omni.entrypoints.request_stream import Outbox  # noqa: E402
from omni.runtime import attention  # noqa: E402
from tools.make_tiny_checkpoint import ensure_checkpoint  # noqa: E402


def thread_cpu_s() -> dict[str, float]:
    """CPU seconds of each thread of this process, by thread name."""
    tick = os.sysconf("SC_CLK_TCK")
    names = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[str, float] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            stat = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the thread ended
        name = names.get(int(tid)) or Path(f"/proc/self/task/{tid}/comm").read_text().strip()
        out[name] = out.get(name, 0.0) + (int(stat[11]) + int(stat[12])) / tick
    return out


def install(engine: Any, device_s: float) -> tuple[StandIn, list[float]]:
    """The stand-ins, the simulated device, and a timer of StageEngine.step. The device is a
    queue: a launched step runs device_s once the one before it is done, and reading its ids
    (LaunchedStep.result) sleeps until then, as a CUDA sync does (the GIL is free meanwhile)."""
    stand_in = StandIn(engine.model.hidden_size)
    engine.model.decode_forward = stand_in
    engine.model.compute_logits = stand_in.compute_logits
    install_stand_in_graphs(engine, stand_in)
    runner = engine.runner
    launch = runner.launch
    device_free = [0.0]  # when the simulated device finishes what was queued so far

    def queued(*args: Any) -> Any:
        launched = launch(*args)
        done = device_free[0] = max(time.perf_counter(), device_free[0]) + device_s
        result = launched.result

        def after_device() -> Any:
            remaining = done - time.perf_counter()
            if remaining > 0:
                time.sleep(remaining)
            return result()

        launched.result = after_device
        return launched

    runner.launch = queued
    starts: list[float] = []  # when each StageEngine.step call began: the step period
    step = engine.step

    def timed_step() -> Any:
        starts.append(time.perf_counter())
        return step()

    engine.step = timed_step
    stats = engine.stats

    def with_timings() -> dict[str, Any]:  # the step starts and thread times, from any process
        return {**stats(), "bench_starts": list(starts), "bench_cpu": thread_cpu_s()}

    engine.stats = with_timings
    return stand_in, starts


def install_in_stage_process() -> None:
    """In a stage process (the processes backend): install() on the engine it builds."""
    import omni.host.stage_host as stage_host

    attention.uses_triton = lambda device: True  # type: ignore[assignment]  # GPU metadata
    create_engine = stage_host.create_engine
    device_s = float(os.environ["BENCH_DEVICE_MS"]) / 1e3

    def with_stand_ins(config: Any) -> Any:
        engine = create_engine(config)
        install(engine, device_s)
        return engine

    stage_host.create_engine = with_stand_ins  # type: ignore[assignment]


if __name__ == "__mp_main__" and "BENCH_DEVICE_MS" in os.environ:
    install_in_stage_process()


SNAPSHOTS = [True]  # a snapshot per step (a streaming client), else only the final one
FLUSHES = [0]  # Outbox flushes: the caller's event loop woken for a batch of snapshots


def count_flushes() -> None:
    flush = Outbox._flush

    def counted(self: Outbox) -> None:
        FLUSHES[0] += 1
        flush(self)

    Outbox._flush = counted  # type: ignore[method-assign]


def timings(omni: AsyncOmni, backend: str) -> tuple[int, list[float], dict[str, float]]:
    """The stage's steps so far, their starts, and CPU seconds by thread (both processes')."""
    stats = omni.stats()["llm"]
    cpu = thread_cpu_s()
    if backend == "processes":
        cpu.update({f"stage:{name}": v for name, v in stats["bench_cpu"].items()})
    return stats["steps"], stats["bench_starts"], cpu


async def level(omni: AsyncOmni, backend: str, batch: int, tokens: int) -> dict:
    params = SamplingParams(max_tokens=tokens, ignore_eos=True)
    prompts = [[(7 * i + 3 * j) % 500 + 1 for j in range(128 + i % 16)] for i in range(batch)]

    async def one(ids: list[int]) -> None:
        request = omni.prepare(ids)
        run = omni.run(request, omni.stage_params(params), step_snapshots=SNAPSHOTS[0])
        async for _ in run:
            pass

    await asyncio.gather(*(one(p) for p in prompts[: min(batch, 4)]))  # warm-up
    steps_before, starts_before, before = timings(omni, backend)
    flushes = FLUSHES[0]
    start = time.perf_counter()
    await asyncio.gather(*(one(p) for p in prompts))
    wall = time.perf_counter() - start
    steps_after, starts, after = timings(omni, backend)
    num_steps = steps_after - steps_before
    wakeups = (FLUSHES[0] - flushes) / num_steps
    walls = starts[len(starts_before) :]
    periods = [b - a for a, b in zip(walls, walls[1:], strict=False)]
    decode = sorted(periods[2:-2])  # the prefill and the ragged end left out
    cpu = {name: (after[name] - before.get(name, 0.0)) / num_steps for name in after}
    return {
        "step": statistics.median(decode),
        "wall": wall,
        "tok_s": batch * tokens / wall,
        "steps": num_steps,
        "cpu": cpu,
        "wakeups": wakeups,
    }


async def run(
    args: argparse.Namespace, backend: str, interval: float | None, ahead: bool
) -> list[dict]:
    runtime = {"backend": backend, "log_level": "WARNING"}
    if backend == "local":
        runtime["stage_threads"] = "per_stage"
    overrides = {
        "runtime": runtime,
        "stages.llm.engine.device": "cpu",
        "stages.llm.engine.cuda_graphs": True,
        "stages.llm.engine.async_scheduling": ahead,
        "stages.llm.engine.max_num_seqs": max(args.batch),
        "stages.llm.engine.block_size": 16,
    }
    default = sys.getswitchinterval()
    if interval is not None:
        sys.setswitchinterval(interval)
    try:
        async with AsyncOmni(model=args.model, **overrides) as omni:
            if backend == "local":  # else the stage process installed them (__mp_main__)
                install(cast(Any, omni._driver().backend).hosts["llm"].engine, args.device_ms / 1e3)
            return [await level(omni, backend, b, args.tokens) for b in args.batch]
    finally:
        sys.setswitchinterval(default)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", default="16,64")
    parser.add_argument("--device-ms", type=float, default=1.1, help="simulated kernels per step")
    parser.add_argument("--tokens", type=int, default=200, help="tokens per request")
    parser.add_argument("--switch-interval", default="default")
    parser.add_argument("--modes", default="sync,ahead", help="engine.async_scheduling off/on")
    parser.add_argument("--model", help="a causal LM checkpoint (default: the tiny qwen2)")
    parser.add_argument("--backend", default="local", help="runtime.backend(s): local, processes")
    parser.add_argument(
        "--snapshots", default="step", choices=["step", "final"],
        help="step: every request streams (a snapshot per step, detokenized); final: results only",
    )  # fmt: skip
    args = parser.parse_args()
    SNAPSHOTS[0] = args.snapshots == "step"
    args.batch = [int(b) for b in args.batch.split(",")]
    args.model = args.model or str(ensure_checkpoint("qwen2", "tiny"))
    os.environ["BENCH_DEVICE_MS"] = str(args.device_ms)  # for a stage process's stand-ins
    count_flushes()
    attention.uses_triton = lambda device: True  # type: ignore[assignment]  # GPU metadata
    print(
        f"simulated device time {args.device_ms} ms per step; stand-in model body; the stage on "
        f"a thread of its own; {os.cpu_count()} CPUs\n"
    )
    print(
        "| backend | steps | switch interval | B | step p50 ms | busy (device / step) | tok/s "
        "| loop wake-ups / step | thread CPU us/step |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for backend in args.backend.split(","):
        for mode in args.modes.split(","):
            for value in args.switch_interval.split(","):
                interval = None if value == "default" else float(value)
                label = (
                    f"{sys.getswitchinterval() * 1e3:g} ms (default)"
                    if interval is None
                    else (f"{interval * 1e3:g} ms")
                )
                levels = asyncio.run(run(args, backend, interval, mode == "ahead"))
                for batch, r in zip(args.batch, levels, strict=True):
                    print(f"| {backend} | {mode} | {label} | {batch} | " + row(args, r))


def row(args: argparse.Namespace, r: dict) -> str:
    busy = args.device_ms / (r["step"] * 1e3)
    threads = ", ".join(
        f"{name} {v * 1e6:.0f}" for name, v in sorted(r["cpu"].items()) if v * 1e6 >= 5
    )
    return (
        f"{r['step'] * 1e3:.2f} | {busy:.0%} | {r['tok_s']:,.0f} | {r['wakeups']:.1f} | {threads} |"
    )


if __name__ == "__main__":
    main()
