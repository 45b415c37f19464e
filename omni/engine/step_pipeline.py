"""StepPipeline: decode steps launched one ahead (engine.async_scheduling).

A synchronous step is schedule -> launch -> read the sampled ids -> update, and the GPU idles
while the host schedules, prepares, reads and updates. Here, once a step is launched, the next
one is scheduled and launched before the first one's ids are read: it feeds them on the device
(the runner gathers them from the launched step's sampled ids), each request holding a
provisional token meanwhile (omni/core/provisional.py). Then the first step's ids are read, its
placeholders resolved and its updates emitted, while the device runs the second. Each call of
`step` thus returns the step before the one it leaves in flight.

A step is launched ahead only where nothing it schedules depends on the ids in flight (else the
call finishes its step synchronously, which the next call then starts from):
- the adapter's decode steps take device ids (no host read of a fed id or sampled code; a
  multi-code step's residual codes are fed from the device with them), and the stage has padded
  (CUDA-graph) decode steps for a batch of this size;
- every running request sampled in the launched step, each has the input of the position it
  feeds next (a streamed upstream may still be adding positions after it), none reaches
  max_tokens or max_model_len with its provisional token, and nobody waiting could be admitted
  (none waits, or max_num_seqs run): the next step is then exactly one decode token per
  running request, in the same order (a request that finishes in the step in flight frees its
  place one step later than a synchronous step would);
- the pool holds every new block that step needs, so scheduling it preempts nobody.
A request whose token in flight stops it (EOS, a stop token) was also fed to the step ahead:
that row is dropped, and its KV lands past the request's end in blocks it then releases.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from omni.config.validate import config_error
from omni.core.prompt_logprobs import record_prompt_logprobs
from omni.core.provisional import Provisional, advance, resolve
from omni.core.request import Request
from omni.core.scheduler_output import ScheduledRequest, SchedulerOutput
from omni.messages import EngineOutput
from omni.runtime.launched_step import FedIds, LaunchedStep

if TYPE_CHECKING:
    from omni.engine.stage_engine import StageEngine

logger = logging.getLogger(__name__)


@dataclass
class _InFlight:
    launched: LaunchedStep
    pending: list[Provisional]  # its requests' placeholders, in its sampled rows' order
    prompt_entries: list[ScheduledRequest]  # those that return prompt logprobs


class StepPipeline:
    def __init__(self, engine: StageEngine) -> None:
        self.engine = engine
        self._in_flight: _InFlight | None = None
        self.num_launched_ahead = 0  # steps launched before the previous one's ids were read

    @classmethod
    def for_engine(cls, engine: StageEngine) -> StepPipeline | None:
        """The engine's pipeline; a ConfigError when its adapter or steps cannot run ahead;
        None (synchronous steps, logged) when its CUDA graphs failed to capture."""
        field = f"stages.{engine.name}.engine.async_scheduling"
        if not engine.model.decode_ids_on_device:
            adapter = engine.config.adapter
            raise config_error(field, f"is true, but adapter {adapter!r} reads fed ids on the host")
        if engine.runner.decode_graphs is None:
            if engine.device.type == "cuda":  # the capture failed and said why
                logger.warning("stage %r: no CUDA graphs, so steps stay synchronous", engine.name)
                return None
            raise config_error(
                field,
                f"is true, but stage {engine.name!r} has no padded decode steps (on the CPU "
                "they need cuda_graphs: true)",
            )
        return cls(engine)

    @property
    def in_flight(self) -> bool:
        return self._in_flight is not None

    def drop(self) -> None:
        """Forget the step in flight (its requests are failing; its ids are never read)."""
        self._in_flight = None

    def step(self) -> EngineOutput:
        engine = self.engine
        current = self._in_flight or self._launch(engine.scheduler.schedule(), None)
        self._in_flight = None
        if self._can_launch_ahead(current):
            self._in_flight = self._launch(engine.scheduler.schedule(), current)
            self.num_launched_ahead += 1
        appended: list[Request] = []
        runner_output = current.launched.result()  # waits for this step only
        for entry in current.prompt_entries:  # prompt chunks never run ahead: no placeholders
            request = engine.scheduler.requests.get(entry.request_id)
            if request is not None and not request.is_finished:
                record_prompt_logprobs(request, entry, runner_output)
        finished = resolve(engine.scheduler, current.pending, runner_output, appended)
        # Streamed rows: those of the step ahead are neither read nor waited for.
        ahead_writes = self._in_flight is not None and engine.output_cache is not None
        engine.rows.writes_in_flight = int(ahead_writes)  # a launch writes the cache once
        try:
            return engine.emit(appended, finished)
        finally:
            engine.rows.writes_in_flight = 0

    def _launch(self, scheduler_output: SchedulerOutput, previous: _InFlight | None) -> _InFlight:
        engine, fed = self.engine, None
        if previous is not None:
            row_of = {r: i for i, r in enumerate(previous.launched.request_ids)}
            rows = [row_of[entry.request_id] for entry in scheduler_output.scheduled]
            assert previous.launched.ids is not None  # _can_launch_ahead: every request sampled
            ids, codes = previous.launched.ids, previous.launched.codes
            fed = FedIds(ids, np.asarray(rows, dtype=np.int64), codes)
        launched = engine.runner.launch(scheduler_output, fed)
        engine.ran(scheduler_output)
        with_codes = launched.codes is not None  # a multi-code step: its codes are provisional
        pending = advance(engine.scheduler, scheduler_output, with_codes=with_codes)
        prompt = [e for e in scheduler_output.scheduled if e.prompt_targets]
        return _InFlight(launched, pending, prompt)

    def _can_launch_ahead(self, current: _InFlight) -> bool:
        engine = self.engine
        scheduler, graphs = engine.scheduler, engine.runner.decode_graphs
        running = scheduler.running
        if not running or graphs is None or current.launched.ids is None:
            return False
        if scheduler.waiting and len(running) < scheduler.config.max_num_seqs:
            return False  # the next step would admit (a full batch admits nobody: it may run)
        if len(running) > min(graphs.batch_sizes[-1], scheduler.config.max_num_batched_tokens):
            return False
        sampled = set(current.launched.request_ids)
        max_model_len, block_size, kv = scheduler.config.max_model_len, engine.block_size, engine.kv
        num_new_blocks = 0
        for request in running:
            if request.request_id not in sampled or not request.is_runnable:
                return False  # its next position's input has not come (a streamed upstream)
            if request.constraint is not None:
                return False  # its next token's mask needs this step's token on the host
            max_tokens = request.sampling_params.max_tokens
            if max_tokens is not None and request.num_output_tokens >= max_tokens:
                return False  # its provisional token ends it by length
            if request.num_tokens >= max_model_len:
                return False
            num_new_blocks += (
                kv.num_blocks_held(request.request_id) * block_size < request.num_tokens
            )
        return num_new_blocks <= kv.num_free_blocks
