"""Timers and device helpers of bench/gpu.py: StepTimer (a live StageEngine's step split into
schedule / execute / update, with the stepping thread's CPU time), device description, and
synchronisation and peak-memory readings that are no-ops (or None) on the CPU."""

from __future__ import annotations

import contextlib
import os
import platform
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

GIB = 1024**3


# ---- timing the live engine ----------------------------------------------------------------------
@dataclass
class StepRecord:
    """One StageEngine.step, split into its parts (seconds)."""

    batch: int  # requests scheduled
    tokens: int  # tokens fed
    decode: bool  # every scheduled request fed exactly one token
    schedule_s: float = 0.0
    execute_s: float = 0.0
    update_s: float = 0.0
    step_s: float = 0.0
    host_s: float = 0.0  # StageHost.run_once around the step (inbox, events): the whole turn
    schedule_cpu_s: float = 0.0  # thread CPU time of schedule
    update_cpu_s: float = 0.0  # thread CPU time of update


@dataclass
class StepTimer:
    """Wraps a live engine's `scheduler.schedule`, `runner.execute`, `update` and `step`, and
    its host's `run_once`, with timers (instance attributes shadow the methods, so the engine's
    own `self.scheduler.schedule()` / `self.update(...)` calls go through them).

    Wall time (perf_counter) for every part, plus the stepping thread's CPU time
    (time.thread_time) for schedule and update: they do no device work, so their CPU time is
    what the host spends on scheduling and bookkeeping per step.

    on_record, when set, is called with each record on the stepping thread right after its host
    turn (bench/gpu_decode.py starts and stops the profiler there, between steps)."""

    records: list[StepRecord] = field(default_factory=list)
    on_record: Callable[[StepRecord], None] | None = None
    _current: StepRecord | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _wrapped: list[tuple[Any, str]] = field(default_factory=list)

    def install(self, host: Any) -> None:
        engine = host.engine
        scheduler, runner = engine.scheduler, engine.runner
        schedule, execute = scheduler.schedule, runner.execute
        update, step, run_once = engine.update, engine.step, host.run_once

        def timed_schedule(*a: Any, **kw: Any) -> Any:
            w0, c0 = time.perf_counter(), time.thread_time()
            out = schedule(*a, **kw)
            w1, c1 = time.perf_counter(), time.thread_time()
            tokens = sum(len(e.token_ids) for e in out.scheduled)
            decode = bool(out.scheduled) and tokens == len(out.scheduled)
            record = StepRecord(len(out.scheduled), tokens, decode, w1 - w0)
            record.schedule_cpu_s = c1 - c0
            self._current = record
            return out

        def timed_execute(*a: Any, **kw: Any) -> Any:
            w0 = time.perf_counter()
            out = execute(*a, **kw)
            if self._current is not None:
                self._current.execute_s = time.perf_counter() - w0
            return out

        def timed_update(*a: Any, **kw: Any) -> Any:
            w0, c0 = time.perf_counter(), time.thread_time()
            out = update(*a, **kw)
            if self._current is not None:
                self._current.update_s = time.perf_counter() - w0
                self._current.update_cpu_s = time.thread_time() - c0
            return out

        def timed_step(*a: Any, **kw: Any) -> Any:
            self._current = None
            w0 = time.perf_counter()
            out = step(*a, **kw)
            if self._current is not None:
                self._current.step_s = time.perf_counter() - w0
            return out

        def timed_run_once(*a: Any, **kw: Any) -> Any:
            self._current = None
            w0 = time.perf_counter()
            out = run_once(*a, **kw)
            record, self._current = self._current, None
            if record is not None and record.step_s > 0:
                record.host_s = time.perf_counter() - w0
                with self._lock:
                    self.records.append(record)
                if self.on_record is not None:
                    self.on_record(record)
            return out

        scheduler.schedule, runner.execute = timed_schedule, timed_execute
        engine.update, engine.step, host.run_once = timed_update, timed_step, timed_run_once
        self._wrapped = [
            (scheduler, "schedule"),
            (runner, "execute"),
            (engine, "update"),
            (engine, "step"),
            (host, "run_once"),
        ]

    def uninstall(self) -> None:
        """Drop the wrappers: the class's methods show through again."""
        for obj, name in self._wrapped:
            delattr(obj, name)
        self._wrapped.clear()

    def take(self) -> list[StepRecord]:
        with self._lock:
            records, self.records = self.records, []
        return records


class StageProcessTimer:
    """StepTimer's records from a stage in a process of its own (runtime.backend processes): the
    stage process installs a StepTimer (`time_stage_processes`, run there when it imports the
    bench's main script) and its stats carry the records so far; `take` returns the new ones."""

    def __init__(self, engine: Any, stage: str = "llm") -> None:
        self.engine, self.stage, self.seen = engine, stage, 0

    def take(self) -> list[StepRecord]:
        records = self.engine.stats()[self.stage]["bench_step_records"]
        new, self.seen = records[self.seen :], len(records)
        return new


def time_stage_processes() -> None:
    """In a stage process: every StageHost it builds gets a StepTimer, its records in stats."""
    from omni.backends import stage_process

    class TimedHost(stage_process.StageHost):  # type: ignore[name-defined,misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.bench_timer = StepTimer()
            self.bench_timer.install(self)

        def stats(self) -> dict[str, Any]:
            with self.bench_timer._lock:
                records = list(self.bench_timer.records)
            return {**super().stats(), "bench_step_records": records}

    stage_process.StageHost = TimedHost  # type: ignore[attr-defined,misc]


# ---- device --------------------------------------------------------------------------------------
def cpu_name() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def device_line(device: str) -> str:
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        return (
            f"device: {torch.cuda.get_device_name(0)} ({props.total_memory / GIB:.1f} GiB, "
            f"compute capability {props.major}.{props.minor}, {props.multi_processor_count} SMs), "
            f"torch {torch.__version__}, CUDA {torch.version.cuda}; host CPU {cpu_name()} "
            f"({os.cpu_count()} cores)"
        )
    return (
        f"device: CPU, {cpu_name()} ({os.cpu_count()} cores, torch threads "
        f"{torch.get_num_threads()}), torch {torch.__version__}"
    )


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def reset_peak(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()


def peak_gib(device: str) -> float | None:
    """torch.cuda.max_memory_allocated since the last reset_peak, in GiB (None on the CPU)."""
    if device != "cuda":
        return None
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() / GIB


def allocated_gib(device: str) -> float | None:
    if device != "cuda":
        return None
    return torch.cuda.memory_allocated() / GIB


def release(device: str) -> None:
    """Return freed blocks to the driver after a model is dropped."""
    import gc

    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
