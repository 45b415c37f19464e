"""GenerationEngine: a non-autoregressive stage (e.g. a vocoder) behind StageEngine's interface.

Such a stage has no KV cache, scheduler or sampler. A request added with its whole input
(input_complete=True) is one call of its adapter's `generate(stage_input, seed) -> waveform`.
A streaming request (input_complete=False: the upstream stage is still generating its codes,
`extend_request` brings the rest) is decoded in chunks as its codes arrive; which chunks are
ready and which work a step takes is omni/engine/chunk_schedule.py. `step()` runs up to
`engine.max_num_seqs` work items: one whole request, or several in ONE `generate_batch` call
where `engine.batch_whole_requests` resolves true (CUDA stages by default), and all ready chunks
in ONE `decode_chunks` call. A stage host drives it like an AR stage (omni/engine/engine.py).

The adapter runs on the stage's device (omni/engine/device.py) and hands back CPU waveforms; a
step holding a stream's first chunk runs on that device's urgent stream (`urgent_stream`).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import time
from collections import OrderedDict
from typing import Any

import torch

from omni.config import StageConfig
from omni.engine.chunk_schedule import ChunkSchedule, Stream, Work, extended_extras
from omni.engine.device import cuda_memory_stats, resolve_device, urgent_stream
from omni.engine.engine import run_until_done
from omni.engine.generation_stats import GenerationStats
from omni.engine.graph_plan import chunk_dtype, chunk_graphs
from omni.engine.stage_memory import limit_transient_memory, reserved_gpu_bytes
from omni.messages import EngineOutput, InputDelta, StageInput, StageResult, StageUpdate
from omni.registry import get_adapter
from omni.runtime.stage_model import (
    BatchedGenerationModel,
    ChunkedGenerationModel,
    ChunkJob,
    GenerationModel,
)

logger = logging.getLogger(__name__)
NOTHING_HELD = {"memory_allocated_bytes": 0}


class GenerationEngine:
    def __init__(self, config: StageConfig, *, model: GenerationModel | None = None) -> None:
        self.config = config
        self.name = config.name
        device = resolve_device(config)  # checked even for an injected model
        adapter = get_adapter(config.adapter) if model is None else model
        can_batch = callable(getattr(adapter, "generate_batch", None))
        if config.engine.batch_whole_requests and not can_batch:  # before loading weights
            raise ValueError(
                f"stage {self.name!r}: engine.batch_whole_requests is true but adapter "
                f"{config.adapter!r} has no generate_batch"
            )
        baseline = reserved_gpu_bytes(device)  # before this stage holds anything
        if model is None:
            model = get_adapter(config.adapter)(config.model, dtype=torch.float32, device=device)
        else:
            device = torch.device(getattr(model, "device", device))
        self.model: GenerationModel = model
        self.device = device
        on_gpu = device.type == "cuda"
        self.chunk_dtype = chunk_dtype(config, model, device)  # before graphs: their precision
        self.cuda_graphs = chunk_graphs(config, model, device)
        limit_transient_memory(config, model, device, baseline)  # after graphs: held memory
        self.batch_whole = can_batch and config.engine.resolved_batch_whole_requests(on_gpu)
        self._pending: OrderedDict[str, tuple[StageInput, float, int]] = OrderedDict()
        self._streams: dict[str, Stream] = {}
        max_whole = config.engine.max_num_seqs if self.batch_whole else 1
        codes = config.engine.resolved_max_num_batched_tokens(generation=True, on_gpu=on_gpu)
        self.chunk_schedule = ChunkSchedule(config, model, max_whole, codes)
        self._order, self.counts = itertools.count(), GenerationStats()

    # ---- requests -----------------------------------------------------------------------------
    def add_request(self, stage_input: StageInput) -> None:
        """Validate and queue; a ValueError leaves the engine and other requests untouched."""
        request_id = stage_input.request_id
        if request_id in self._pending or request_id in self._streams:
            raise ValueError(f"request_id {request_id!r} is already in stage {self.name!r}")
        if not stage_input.input_complete and not isinstance(self.model, ChunkedGenerationModel):
            raise ValueError(f"request {request_id!r}: stage {self.name!r} cannot decode in chunks")
        try:
            self.model.check_inputs(stage_input)  # adapter hook (StageModelBase: accepts all)
        except ValueError as e:
            raise ValueError(f"request {request_id!r}: {e}") from e
        arrival, order = time.perf_counter(), next(self._order)
        if stage_input.input_complete:
            self._pending[request_id] = (stage_input, arrival, order)
            return
        self._streams[request_id] = Stream(
            stage_input, arrival, order, self._seed(stage_input), list(stage_input.prompt_token_ids)
        )

    def extend_request(self, delta: InputDelta) -> None:
        """More codes for a streaming request; a ValueError (unknown request, input already
        complete, codes the model refuses) leaves the request as it was."""
        stream = self._streams.get(delta.request_id)
        if stream is None:
            raise ValueError(f"request {delta.request_id!r} is not streaming in {self.name!r}")
        if stream.input_complete:
            raise ValueError(f"request {delta.request_id!r}: its input is already complete")
        if delta.new_token_ids or delta.extras:
            token_ids = stream.token_ids + list(delta.new_token_ids)
            try:
                extras = extended_extras(stream.stage_input.extras, delta)
                stage_input = dataclasses.replace(
                    stream.stage_input, prompt_token_ids=token_ids, extras=extras
                )
                self.model.check_inputs(stage_input)
            except ValueError as e:
                raise ValueError(f"request {delta.request_id!r}: {e}") from e
            stream.token_ids, stream.stage_input = token_ids, stage_input
        stream.input_complete = delta.finished

    def abort(self, request_ids: list[str]) -> list[StageResult]:
        results = []
        for request_id in request_ids:
            item = self._pending.pop(request_id, None)
            if item is not None:
                results.append(self._result(item[0], "aborted", item[1]))
            stream = self._streams.pop(request_id, None)
            if stream is not None:
                results.append(self._stream_result(stream, "aborted"))
        return results

    def fail_all(self) -> list[StageResult]:
        """After a step raised: drop every request (this stage keeps no cache)."""
        return self.abort([*self._pending, *self._streams])

    @property
    def has_unfinished(self) -> bool:
        """Whether it holds any request (a stream may be waiting for codes)."""
        return bool(self._pending or self._streams)

    @property
    def has_ready_work(self) -> bool:
        """Whether step() would do anything now: a whole request, a ready chunk, or a stream
        whose complete input is all decoded (it finishes)."""
        return bool(self._pending) or any(
            s.done or self.chunk_schedule.ready_chunks(s) for s in self._streams.values()
        )

    @property
    def has_urgent_work(self) -> bool:
        """Whether some stream's first chunk is ready (a few codes: its first audio). Whole
        requests are not urgent: each is a long decode, and the stages before must not wait."""
        return any(
            not s.chunks and self.chunk_schedule.ready_chunks(s) for s in self._streams.values()
        )

    @property
    def num_steps(self) -> int:
        return self.counts.num_steps

    @property
    def num_requests(self) -> int:
        return len(self._pending) + len(self._streams)

    # ---- the loop -----------------------------------------------------------------------------
    def step(self) -> EngineOutput:
        work = self.chunk_schedule.schedule(self._pending, self._streams)
        if not work and not any(s.done for s in self._streams.values()):
            return EngineOutput()
        self.counts.num_steps += 1
        start = time.perf_counter()
        failed: dict[str, Exception] = {}
        whole = [self._pending.pop(w.request_id) for w in work if w.end == 0]
        results = self._generate(whole, failed) if whole else []
        chunks = [w for w in work if w.end > 0]
        with urgent_stream(self.device, any(w.start == 0 for w in chunks)):  # a first audio
            updates = self._decode(chunks, failed) if chunks else []
        for request_id in [i for i, s in self._streams.items() if s.done]:
            results.append(self._stream_result(self._streams.pop(request_id), "stopped"))
        finished = [r for r in results if r is not None]
        self.counts.busy_s += time.perf_counter() - start
        self.counts.num_finished += len(finished)
        return EngineOutput(updates=updates, finished=finished, failed=failed)

    def _generate(
        self, items: list[tuple[StageInput, float, int]], failed: dict[str, Exception]
    ) -> list[StageResult | None]:
        """Whole requests: several in one generate_batch call (if it raises, each alone, so that
        only the requests that break it fail), or one by generate."""
        inputs = [item[0] for item in items]
        seeds = [self._seed(stage_input) for stage_input in inputs]
        audios: list[torch.Tensor | None] = []
        if len(items) > 1:
            assert isinstance(self.model, BatchedGenerationModel)  # only then are there several
            try:
                audios = list(self.model.generate_batch(inputs, seeds))
            except Exception:
                audios = []
        if not audios:
            for stage_input, seed in zip(inputs, seeds, strict=True):
                try:
                    audios.append(self.model.generate(stage_input, seed))
                except Exception as e:  # one broken request fails alone; its host reports it
                    failed[stage_input.request_id] = e
                    audios.append(None)
        results: list[StageResult | None] = []
        for (stage_input, arrival, _), audio in zip(items, audios, strict=True):
            if audio is None:
                results.append(None)
                continue
            audio, rate = audio.cpu(), self.model.sample_rate
            self.counts.audio_s += audio.numel() / rate
            result = self._result(stage_input, "stopped", arrival)
            self.counts.first_audio_s.append(result.timings["latency_s"])
            results.append(dataclasses.replace(result, audio=audio, sample_rate=rate))
        return results

    def _seed(self, stage_input: StageInput) -> int:
        seed = stage_input.sampling_params.seed
        return self.config.engine.seed if seed is None else seed

    def _decode(self, chunks: list[Work], failed: dict[str, Exception]) -> list[StageUpdate]:
        """All ready chunks in one decode_chunks call; if it raises, each chunk alone, so that
        only the requests that break it fail."""
        assert isinstance(self.model, ChunkedGenerationModel)  # add_request checked it
        left, ahead = self.chunk_schedule.context()
        streams = [self._streams[w.request_id] for w in chunks]
        jobs = [
            ChunkJob(tuple(s.token_ids), w.start, w.end, left, ahead, s.input_complete, s.seed,
                     s.stage_input.extras)
            for w, s in zip(chunks, streams, strict=True)
        ]  # fmt: skip
        audios: list[torch.Tensor | None]
        try:
            audios = list(self.model.decode_chunks(jobs))
        except Exception:
            audios = []
            for w, job in zip(chunks, jobs, strict=True):
                try:
                    audios.append(self.model.decode_chunks([job])[0])
                except Exception as e:
                    failed[w.request_id] = e
                    audios.append(None)
        updates = []
        for w, stream, audio in zip(chunks, streams, audios, strict=True):
            if w.request_id in failed:
                self._streams.pop(w.request_id, None)
                continue
            assert audio is not None
            audio = audio.cpu()  # results leave the stage on the host (a no-op for adapters)
            stream.chunks.append(audio)
            stream.num_emitted_tokens = w.end
            if stream.first_audio_s is None:
                stream.first_audio_s = time.perf_counter() - stream.arrival
            self.counts.num_chunks += 1
            rate = self.model.sample_rate
            self.counts.audio_s += audio.numel() / rate
            update = StageUpdate(w.request_id, self.name, [], 0, audio=audio, sample_rate=rate)
            updates.append(update)
        return updates

    def run_until_done(self, max_steps: int = 1_000_000) -> list[StageResult]:
        """Step until every queued request finished (direct use: tests and benchmarks)."""
        return run_until_done(self, max_steps)

    def _result(
        self, stage_input: StageInput, reason: str, arrival: float, **timings: float
    ) -> StageResult:
        return StageResult(
            request_id=stage_input.request_id,
            stage=self.name,
            prompt_token_ids=list(stage_input.prompt_token_ids),
            token_ids=[],
            finish_reason=reason,
            timings={"latency_s": time.perf_counter() - arrival, **timings},
        )

    def _stream_result(self, stream: Stream, reason: str) -> StageResult:
        """A stream's result: "stopped" carries all its chunks joined (no codes: no samples)."""
        first = {} if stream.first_audio_s is None else {"first_audio_s": stream.first_audio_s}
        stage_input = dataclasses.replace(stream.stage_input, prompt_token_ids=stream.token_ids)
        result = self._result(stage_input, reason, stream.arrival, **first)
        if reason != "stopped":
            return result
        self.counts.num_streams_done += 1
        if stream.first_audio_s is not None:
            self.counts.first_audio_s.append(stream.first_audio_s)
        audio = torch.cat(stream.chunks) if stream.chunks else torch.zeros(0)
        return dataclasses.replace(result, audio=audio, sample_rate=self.model.sample_rate)

    def stats(self) -> dict[str, Any]:
        return {
            "stage": self.name,
            **self.counts.as_dict(),
            "pending": self.num_requests,
            "streaming": len(self._streams),
            "device": str(self.device),
            "dtype": "float32",
            **getattr(self.model, "speed_stats", dict)(),
            # No KV or output cache here: on the CPU nothing is held between requests.
            **(cuda_memory_stats(self.device) if self.device.type == "cuda" else NOTHING_HELD),
        }
