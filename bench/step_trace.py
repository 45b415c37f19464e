"""Where a level's time goes inside each stage: every engine step (start, length, size) and
every request's admission, recorded on the local backend's stage hosts while a level runs.

The "where the time goes" table gives per-request milestones (routed, first token, first audio);
this one says what the stage was doing in between: whether a request waited in the host's queue
(routed -> added: the input processor and the host's turn), for a step to admit it (added ->
first step that schedules it), or in one long step (a capture or compile on first use shows up
as a step far longer than the stage's median). Bench-only wrappers: `engine.step`,
`engine.add_request` and, for AR stages, `engine.runner.launch` (what a step scheduled; with
engine.async_scheduling a call launches the step after the one it returns).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Step:
    start: float
    ms: float
    num_reqs: int
    num_tokens: int  # scheduled tokens (AR stages); chunks out (the vocoder)
    new_ids: tuple[str, ...]  # requests this step scheduled for the first time in the level
    out_ids: tuple[str, ...]  # requests that got output (a token, a chunk) from it


@dataclass
class StageTrace:
    added: dict[str, float] = field(default_factory=dict)
    steps: list[Step] = field(default_factory=list)
    scheduled: tuple[int, int, tuple[str, ...]] | None = None  # the running step's (AR)
    seen: set[str] = field(default_factory=set)


class StepTrace:
    """Installs on an AsyncOmni with the local backend (no-op elsewhere)."""

    def __init__(self, omni: Any) -> None:
        self.stages: dict[str, StageTrace] = {}
        self.on = False
        self.t0 = time.perf_counter()
        backend = omni._driver().backend
        for name, host in getattr(backend, "hosts", {}).items():
            self.stages[name] = trace = StageTrace()
            self._wrap(host.engine, trace)

    def _wrap(self, engine: Any, trace: StageTrace) -> None:
        step, add = engine.step, engine.add_request

        def add_request(stage_input: Any) -> Any:
            out = add(stage_input)
            if self.on:
                trace.added[stage_input.request_id] = time.perf_counter() - self.t0
            return out

        def timed_step() -> Any:
            start = time.perf_counter()
            out = step()
            if self.on:
                ms = (time.perf_counter() - start) * 1e3
                out_ids = tuple({u.request_id: None for u in out.updates})
                num_reqs, num_tokens, ids = trace.scheduled or (len(out_ids), len(out.updates), ())
                trace.scheduled = None
                if not ids:  # the vocoder: a stream's first output is its first chunk
                    ids = out_ids
                new = tuple(i for i in ids if i not in trace.seen)
                trace.seen.update(new)
                if num_reqs or out.finished:
                    trace.steps.append(
                        Step(start - self.t0, ms, num_reqs, num_tokens, new, out_ids)
                    )
            return out

        engine.step, engine.add_request = timed_step, add_request
        runner = getattr(engine, "runner", None)
        if runner is not None and hasattr(runner, "launch"):  # execute launches too
            launch = runner.launch

            def traced_launch(scheduler_output: Any, *args: Any) -> Any:
                scheduled = scheduler_output.scheduled
                trace.scheduled = (
                    len(scheduled),
                    scheduler_output.num_batched_tokens,
                    tuple(s.request_id for s in scheduled),
                )
                return launch(scheduler_output, *args)

            runner.launch = traced_launch

    def start(self) -> None:
        for trace in self.stages.values():
            trace.added.clear()
            trace.steps.clear()
            trace.seen.clear()
        self.t0 = time.perf_counter()
        self.on = True

    def take(self) -> dict[str, Any]:
        """The level's summary per stage (times in ms since the level started)."""
        self.on = False
        return {name: summarize(trace) for name, trace in self.stages.items() if trace.steps}


def summarize(trace: StageTrace) -> dict[str, Any]:
    steps = trace.steps
    first_step: dict[str, Step] = {}
    first_out: dict[str, float] = {}
    for s in steps:
        for request_id in s.new_ids:
            first_step.setdefault(request_id, s)
        for request_id in s.out_ids:
            first_out.setdefault(request_id, s.start + s.ms / 1e3)
    wait, admit_ms, to_out = [], [], []
    for request_id, added in trace.added.items():
        admitting = first_step.get(request_id)
        if admitting is not None:
            wait.append((admitting.start - added) * 1e3)
            admit_ms.append(admitting.ms)
        if request_id in first_out:
            to_out.append((first_out[request_id] - added) * 1e3)
    lengths = [s.ms for s in steps]
    longest = sorted(steps, key=lambda s: -s.ms)[:3]
    return {
        "steps": len(steps),
        "median_ms": statistics.median(lengths),
        "wait_ms": _p50_max(wait),
        "admit_step_ms": _p50_max(admit_ms),
        "to_output_ms": _p50_max(to_out),
        "longest": [(s.start * 1e3, s.ms, s.num_reqs, s.num_tokens) for s in longest],
    }


def _p50_max(values: list[float]) -> tuple[float, float] | None:
    return (statistics.median(values), max(values)) if values else None


def report(traces: list[tuple[str, dict[str, Any]]]) -> None:
    """One table: per level and stage, the admission wait, the admitting step, the time to the
    first output, and the three longest steps (at ms since the level started: ms, reqs/tokens)."""
    if not any(t for _, t in traces):
        return
    print(
        "\nomni, inside the stages (bench/step_trace.py): ms, p50 / max over the level's "
        "requests; 'wait' = added to the host -> first step that schedules it; 'longest' = "
        "the level's three longest steps: start ms +length ms (requests/tokens or chunks)"
    )
    print(
        "| C | stage | steps | median step | wait | admitting step | added -> 1st output "
        "| longest |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for label, per_stage in traces:
        for name, t in per_stage.items():
            longest = ", ".join(
                f"{at:.0f} +{ms:.1f} ({reqs}/{tokens})" for at, ms, reqs, tokens in t["longest"]
            )
            print(
                f"| {label} | {name} | {t['steps']} | {t['median_ms']:.1f} | {_pair(t['wait_ms'])} "
                f"| {_pair(t['admit_step_ms'])} | {_pair(t['to_output_ms'])} | {longest} |"
            )


def _pair(value: tuple[float, float] | None) -> str:
    return "-" if value is None else f"{value[0]:.1f} / {value[1]:.1f}"
