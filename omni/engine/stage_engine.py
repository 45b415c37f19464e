"""StageEngine: one stage's model with its scheduler, KV cache, output cache and runner.

`step()` is schedule -> execute -> update (with engine.async_scheduling, one decode step ahead:
step_pipeline.py). A step reports every request it advanced (StageUpdate: the new tokens) and
every request it finished (StageResult, with the per-token outputs from the output cache).
Device and dtype: device.py; the KV pool's size and the output cache's place, decided once at
construction: stage_memory.py; the output rows' bookkeeping: output_rows.py.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

from omni.config import DEFAULT_MAX_MODEL_LEN, StageConfig
from omni.core.kv_cache_manager import KVCacheManager
from omni.core.request import Request, RequestStatus
from omni.core.scheduler import Scheduler, SchedulerConfig
from omni.core.scheduler_output import RunnerOutput, SchedulerOutput
from omni.engine.device import device_stats, resolve_device, resolve_dtype
from omni.engine.engine import run_until_done
from omni.engine.gpu_profile import allocated_bytes
from omni.engine.graph_plan import capture_step_graphs, fuse_kernels, padded_decode, trial_capture
from omni.engine.json_outputs import JsonOutputs
from omni.engine.output_rows import OutputRows
from omni.engine.request_checks import check_request, new_request
from omni.engine.stage_memory import StageMemory
from omni.engine.step_pipeline import StepPipeline
from omni.messages import EngineOutput, InputDelta, StageInput, StageResult, StageUpdate
from omni.registry import get_adapter, get_adapter_spec
from omni.runtime.model_runner import ModelRunner
from omni.runtime.output_cache import OutputCache
from omni.runtime.stage_model import StageModel

logger = logging.getLogger(__name__)


class StageEngine:
    def __init__(self, config: StageConfig, *, model: StageModel | None = None) -> None:
        self.config = config
        self.name = config.name
        engine = config.engine
        # Checked even for an injected model: a stage asking for a GPU it has not is an error.
        device = resolve_device(config)
        dtype = resolve_dtype(config, device)
        # Its footprint is measured from here (on the local backend, earlier stages hold the rest).
        baseline = allocated_bytes(device)
        if model is None:
            model = get_adapter(config.adapter)(config.model, dtype=dtype, device=device)
        else:
            device = torch.device(getattr(model, "device", device))  # where its weights are
            baseline = 0  # loaded before we saw it: everything the process holds counts
        self.model, self.device, self.dtype = model, device, dtype
        self.num_fused_modules = fuse_kernels(config, model, device)
        padded = padded_decode(config, model, device)  # CUDA-graph steps: profiled, then run
        self.block_size = engine.block_size
        self.max_model_len: int = engine.max_model_len or DEFAULT_MAX_MODEL_LEN
        # None (a StageConfig outside an OmniConfig): every output the adapter emits.
        outputs = engine.outputs
        emits = get_adapter_spec(config.adapter).emits if outputs is None else outputs
        memory = StageMemory.plan(
            config,
            model,
            device=device,
            dtype=dtype,
            max_model_len=self.max_model_len,
            num_outputs=len(emits),
            baseline_bytes=baseline,
            capture=trial_capture(config, model, device, self.max_model_len, padded),
        )
        self.num_blocks = memory.num_blocks
        self.max_request_tokens = min(self.max_model_len, self.num_blocks * engine.block_size)
        self.json = JsonOutputs(config.model, model.vocab_size, model.eos_token_id)
        self.kv = KVCacheManager(
            self.num_blocks,
            engine.block_size,
            enable_caching=engine.enable_prefix_caching,
            hash_algo=engine.hash_algo,
        )
        self.output_cache: OutputCache | None = None
        if outputs != ():
            keep = None if outputs is None else frozenset(outputs)
            self.output_cache = OutputCache(
                self.num_blocks, engine.block_size, dtype, keep,
                device=memory.output_cache_device, source_device=device,
            )  # fmt: skip
            if keep is None or "hidden_states" in keep:
                self.output_cache.allocate("hidden_states", (self.model.hidden_size,))
        self.rows = OutputRows(
            self.kv,
            self.output_cache,
            block_size=engine.block_size,
            outputs_cached=engine.outputs_cached,
        )
        self.scheduler = Scheduler(
            SchedulerConfig(
                engine.max_num_seqs, engine.resolved_max_num_batched_tokens(), self.max_model_len
            ),
            self.kv,
            hit_filter=self.rows.usable_hits if engine.enable_prefix_caching else None,
        )
        self.runner = ModelRunner(
            self.model,
            num_blocks=self.num_blocks,
            block_size=engine.block_size,
            output_cache=self.output_cache,
            seed=engine.seed,
            device=device,
            padded_decode=padded,
            max_num_seqs=engine.max_num_seqs,
            max_num_batched_tokens=engine.resolved_max_num_batched_tokens(),
            max_model_len=self.max_model_len,
            max_graph_batch=engine.graph_batch_limit,
        )
        self.runner.warm_up()  # outputs it discovers belong to step 0, before any request
        capture_step_graphs(config, model, self.runner)
        self.pipeline = StepPipeline.for_engine(self) if engine.async_scheduling else None
        self.num_steps = 0
        self.busy_s = 0.0  # time in step(): this stage's share of the pipeline's compute
        if self.output_cache is not None:
            self.output_cache.step = 1  # the number of the step about to run
        self._arrival: dict[str, float] = {}

    # ---- requests -----------------------------------------------------------------------------
    def add_request(self, stage_input: StageInput) -> None:
        """Validate and queue; a ValueError here leaves the engine and other requests untouched."""
        model = self.model
        request = new_request(stage_input, self.max_request_tokens, model.eos_token_id, self.json)
        check_request(
            request,
            stage=self.name,
            max_model_len=self.max_model_len,
            vocab_size=model.vocab_size,
            block_size=self.block_size,
            num_blocks=self.num_blocks,
            known=self.scheduler.requests,
        )
        try:
            self.model.check_inputs(stage_input)  # adapter hook (StageModelBase: accepts all)
        except ValueError as e:
            raise ValueError(f"request {request.request_id!r}: {e}") from e
        if not stage_input.input_complete:
            request.input_limit = self.model.input_limit(request.request_id)
            if request.input_limit is not None and request.input_limit < 1:
                raise ValueError(f"request {request.request_id!r}: no input position has come")
        if stage_input.extras:
            self.runner.add_request_extras(request.request_id, stage_input.extras)
        if stage_input.step_rows:
            self.rows.report_step_rows(request.request_id)
        self.scheduler.add_request(request)
        self._arrival[request.request_id] = time.perf_counter()

    def extend_request(self, delta: InputDelta) -> None:
        """More input for a request added with input_complete=False (its upstream stage goes on
        generating it): the adapter takes it and says up to which position inputs have come."""
        request = self.scheduler.requests.get(delta.request_id)
        if request is None:
            raise ValueError(f"request {delta.request_id!r} is not in stage {self.name!r}")
        request.input_limit = self.model.extend_inputs(delta.request_id, delta)

    def abort(self, request_ids: list[str]) -> list[StageResult]:
        finished = self.scheduler.finish_requests(request_ids, RequestStatus.FINISHED_ABORTED)
        return self._dropped(finished)

    def _dropped(self, requests: list[Request]) -> list[StageResult]:
        for request in requests:
            self.rows.forget(request.request_id)
        self.runner.release([request.request_id for request in requests])
        return [self._result(request, tensors={}) for request in requests]

    def fail_all(self) -> list[StageResult]:
        """After a step raised: drop every request, and every cached hash, since the failed step
        may have registered blocks whose KV and rows it never wrote."""
        if self.pipeline is not None:
            self.pipeline.drop()  # its step's ids are never read: every request fails
        done = [r for r in self.scheduler.requests.values() if r.is_finished]
        for request in done:  # finished in update() before it raised: never reported
            self.scheduler.release(request)
        failed = self._dropped(done) + self.abort(list(self.scheduler.requests))
        if not self.kv.reset_prefix_cache():
            logger.error("stage %r: prefix cache not reset, blocks still held", self.name)
        return failed

    @property
    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished or bool(self.pipeline and self.pipeline.in_flight)

    @property
    def has_ready_work(self) -> bool:
        """Whether a step would do anything now (not every request is waiting for input)."""
        return self.scheduler.has_ready_work or bool(self.pipeline and self.pipeline.in_flight)

    @property
    def has_urgent_work(self) -> bool:
        """Never: steps are short, turns by time do it (omni/backends/stage_turns.py)."""
        return False

    @property
    def num_requests(self) -> int:
        return len(self.scheduler.requests)

    # ---- the loop -----------------------------------------------------------------------------
    def step(self) -> EngineOutput:
        start = time.perf_counter()
        if self.pipeline is not None:  # a decode step in flight (engine.async_scheduling)
            output = self.pipeline.step()
        else:
            scheduler_output = self.scheduler.schedule()
            output = self.update(scheduler_output, self.runner.execute(scheduler_output))
        self.busy_s += time.perf_counter() - start
        return output

    def update(
        self, scheduler_output: SchedulerOutput, runner_output: RunnerOutput
    ) -> EngineOutput:
        self.ran(scheduler_output)
        appended: list[Request] = []  # the requests that got a token, one each
        finished = self.scheduler.update_from_output(scheduler_output, runner_output, appended)
        return self.emit(appended, finished)

    def ran(self, scheduler_output: SchedulerOutput) -> None:
        self.num_steps += 1
        self.rows.after_step(scheduler_output, self.num_steps)

    def emit(self, appended: list[Request], finished: list[Request]) -> EngineOutput:
        """A step's updates (each appended request's new token) and finished results."""
        name = self.name
        new_rows = self.rows.new_rows if self.rows.any_step_rows else None
        step_rows = [new_rows(r) if new_rows else {} for r in appended]
        updates = [
            StageUpdate(
                r.request_id,
                name,
                [r.last_known_output],  # with a step ahead, its placeholder comes after
                max(r.num_cached_tokens, 0),
                t,
                # a multi-code stage: the token's residual codes, appended with it
                new_codes=[r.last_known_codes] if r.output_codes else [],
                new_logprobs=r.last_known_logprobs if r.output_logprobs else [],
            )
            for r, t in zip(appended, step_rows, strict=True)
        ]
        results = []
        for request in finished:
            tensors = self.rows.finish(request)
            if request.output_codes:  # a multi-code stage: each token with its residual codes
                pairs = zip(request.output_token_ids, request.output_codes, strict=True)
                tensors["codes"] = torch.tensor([(t, *c) for t, c in pairs], dtype=torch.int64)
            results.append(self._result(request, tensors=tensors))
        # Released once every result is built: if one raises, fail_all reports them all.
        for request in finished:
            self.scheduler.release(request)
        self.runner.release([request.request_id for request in finished])
        return EngineOutput(updates, results)

    def run_until_done(self, max_steps: int = 1_000_000) -> list[StageResult]:
        """Step until every queued request finished (direct use: tests and benchmarks)."""
        return run_until_done(self, max_steps)

    # ---- results ------------------------------------------------------------------------------
    def _result(self, request: Request, tensors: dict) -> StageResult:
        arrival = self._arrival.pop(request.request_id, None)
        return StageResult(
            request_id=request.request_id,
            stage=self.name,
            prompt_token_ids=list(request.prompt_token_ids),
            token_ids=list(request.output_token_ids),
            finish_reason=request.status.value,
            num_cached_tokens=max(request.num_cached_tokens, 0),
            tensors=tensors,
            timings={"latency_s": time.perf_counter() - arrival} if arrival else {},
            logprobs=request.logprobs,
            prompt_logprobs=request.all_prompt_logprobs,
        )

    def stats(self) -> dict[str, Any]:
        return {
            "stage": self.name,
            "steps": self.num_steps,
            "busy_s": self.busy_s,
            **{f"kv_{k}": v for k, v in self.kv.stats.as_dict().items()},
            "kv_evictions": self.kv.pool.num_evictions,
            "kv_blocks_in_use": self.kv.num_blocks - self.kv.num_free_blocks,
            "preemptions": self.scheduler.num_preemptions,
            "rows_recomputed": self.scheduler.num_hit_blocks_refused * self.block_size,
            "num_blocks": self.num_blocks,
            **(self.output_cache.stats() if self.output_cache is not None else {}),
            **device_stats(self.device, self.dtype, self.runner.kv_cache_bytes, self.output_cache),
            **self.runner.step_stats(),
            "fused_modules": self.num_fused_modules,
            "steps_launched_ahead": self.pipeline.num_launched_ahead if self.pipeline else 0,
            **self.json.stats(),
        }
