"""GenerationEngine: a non-autoregressive stage (e.g. a vocoder) behind StageEngine's interface.

Such a stage has no KV cache, scheduler or sampler: each request is one call of its adapter's
`generate(stage_input, seed) -> waveform`. `step()` runs up to `engine.max_num_seqs` pending
requests in arrival order and returns their results, so a stage host drives it exactly like an
AR stage (the `Engine` contract in omni/engine/engine.py).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import OrderedDict
from typing import Any

import torch

from omni.config import StageConfig
from omni.engine.engine import run_until_done
from omni.messages import EngineOutput, StageInput, StageResult
from omni.registry import get_adapter
from omni.runtime.stage_model import GenerationModel

logger = logging.getLogger(__name__)


class GenerationEngine:
    def __init__(self, config: StageConfig, *, model: GenerationModel | None = None) -> None:
        self.config = config
        self.name = config.name
        self.model: GenerationModel = model or get_adapter(config.adapter)(
            config.model, dtype=torch.float32
        )
        self._pending: OrderedDict[str, tuple[StageInput, float]] = OrderedDict()
        self.num_steps = 0
        self.num_finished = 0
        self.busy_s = 0.0
        self.audio_s = 0.0  # seconds of audio produced

    def add_request(self, stage_input: StageInput) -> None:
        """Validate and queue; a ValueError leaves the engine and other requests untouched."""
        rid = stage_input.request_id
        if rid in self._pending:
            raise ValueError(f"request_id {rid!r} is already in stage {self.name!r}")
        try:
            self.model.check_inputs(stage_input)  # adapter hook (StageModelBase: accepts all)
        except ValueError as e:
            raise ValueError(f"request {rid!r}: {e}") from e
        self._pending[rid] = (stage_input, time.perf_counter())

    def abort(self, request_ids: list[str]) -> list[StageResult]:
        results = []
        for rid in request_ids:
            item = self._pending.pop(rid, None)
            if item is not None:
                results.append(self._result(item[0], "aborted", item[1]))
        return results

    def fail_all(self) -> list[StageResult]:
        """After a step raised: drop every pending request (this stage keeps no cache)."""
        return self.abort(list(self._pending))

    @property
    def has_unfinished(self) -> bool:
        return bool(self._pending)

    @property
    def num_requests(self) -> int:
        return len(self._pending)

    def step(self) -> EngineOutput:
        batch = [self._pending.popitem(last=False)[1] for _ in range(self._batch_size())]
        if not batch:
            return EngineOutput()
        self.num_steps += 1
        start = time.perf_counter()
        results = []
        failed: dict[str, Exception] = {}
        for stage_input, arrival in batch:
            seed = stage_input.sampling_params.seed
            try:
                audio = self.model.generate(
                    stage_input, self.config.engine.seed if seed is None else seed
                )
            except Exception as e:  # one broken request fails alone; its host reports it
                failed[stage_input.request_id] = e
                continue
            result = self._result(stage_input, "stopped", arrival)
            results.append(
                dataclasses.replace(result, audio=audio, sample_rate=self.model.sample_rate)
            )
        self.busy_s += time.perf_counter() - start
        self.num_finished += len(results)
        self.audio_s += sum(r.audio.numel() for r in results) / self.model.sample_rate
        return EngineOutput(finished=results, failed=failed)

    def _batch_size(self) -> int:
        return min(len(self._pending), self.config.engine.max_num_seqs)

    def run_until_done(self, max_steps: int = 1_000_000) -> list[StageResult]:
        """Step until every queued request finished (direct use: tests and benchmarks)."""
        return run_until_done(self, max_steps)

    def _result(self, stage_input: StageInput, reason: str, arrival: float) -> StageResult:
        return StageResult(
            request_id=stage_input.request_id,
            stage=self.name,
            prompt_token_ids=list(stage_input.prompt_token_ids),
            token_ids=[],
            finish_reason=reason,
            timings={"latency_s": time.perf_counter() - arrival},
        )

    def stats(self) -> dict[str, Any]:
        return {
            "stage": self.name,
            "steps": self.num_steps,
            "finished": self.num_finished,
            "pending": len(self._pending),
            "busy_s": self.busy_s,
            "audio_s": self.audio_s,
            # Real-time factor: compute time per second of audio (< 1: faster than real time).
            "rtf": self.busy_s / self.audio_s if self.audio_s else None,
        }
