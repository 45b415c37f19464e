"""Omni: builds the stages from a config and routes every request along the stage graph.

Data flow: generate() normalizes prompts (PromptProcessor) -> root stages get StageInputs ->
each stage's results go through the consumers' input processors to the next stages -> when the
final stage (or any stage, with an error) is done, the request's OmniOutput is complete.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator, Sequence
from typing import Any

from omni.config import OmniConfig, config_for_model, load_config
from omni.core.sampling_params import SamplingParams
from omni.inputs import PromptInput, PromptProcessor
from omni.outputs import OmniOutput, StageInput, StageResult
from omni.stage_client import LocalStageClient, StageClient, error_result
from stages.registry import get_input_processor

logger = logging.getLogger(__name__)


class Omni:
    def __init__(
        self,
        config: str | os.PathLike | dict | OmniConfig | None = None,
        *,
        model: str | None = None,
        **overrides: Any,
    ) -> None:
        self.config = _resolve_config(config, model, overrides)
        self.order = self.config.topological_order()
        root = self.config.root_stages[0]
        self.prompt_processor = PromptProcessor(root.model)
        self.clients: dict[str, StageClient] = self._start_stages()
        self._counter = 0

    def _start_stages(self) -> dict[str, StageClient]:
        if self.config.runtime.backend == "local":
            return {name: LocalStageClient(self.config.stage(name)) for name in self.order}
        from omni.ray_backend import start_ray_stages

        return start_ray_stages(self.config, self.order)

    # ---- public API ---------------------------------------------------------------------------
    def generate(
        self,
        prompts: Any,
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        use_tqdm: bool = True,
    ) -> list[OmniOutput]:
        requests = self._prepare(prompts)
        done: dict[str, OmniOutput] = {}
        progress = _progress(len(requests), use_tqdm)
        for output in self._run(requests, self._stage_params(sampling_params)):
            done[output.request_id] = output
            progress.update(1)
        progress.close()
        return [done[r.request_id] for r in requests]

    def stream(
        self,
        prompts: Any,
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> Iterator[StageResult]:
        """Every stage's result of every request, as soon as that stage finishes it."""
        requests = self._prepare(prompts)
        yield from self._run(requests, self._stage_params(sampling_params), per_stage=True)

    def stats(self) -> dict[str, dict]:
        return {name: client.stats() for name, client in self.clients.items()}

    def shutdown(self) -> None:
        for client in self.clients.values():
            client.shutdown()
        self.clients = {}

    def __enter__(self) -> Omni:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # ---- internals ----------------------------------------------------------------------------
    def _prepare(self, prompts: Any) -> list[PromptInput]:
        if isinstance(prompts, str | dict) or (
            isinstance(prompts, list | tuple) and prompts and isinstance(prompts[0], int)
        ):
            prompts = [prompts]
        if not isinstance(prompts, list | tuple) or not prompts:
            raise ValueError(f"prompts must be a prompt or a non-empty list of prompts, got {prompts!r}")
        requests = []
        for prompt in prompts:
            self._counter += 1
            requests.append(self.prompt_processor(f"req-{self._counter}", prompt))
        return requests

    def _stage_params(self, params: SamplingParams | Sequence[SamplingParams] | None) -> dict[str, SamplingParams]:
        stages = self.config.stages
        if params is None:
            return {s.name: s.sampling for s in stages}
        if isinstance(params, SamplingParams):
            return {s.name: params for s in stages}
        params = list(params)
        if len(params) != len(stages) or not all(isinstance(p, SamplingParams) for p in params):
            raise ValueError(
                f"sampling_params must be one SamplingParams or a list of {len(stages)} "
                f"(one per stage: {[s.name for s in stages]}), got {params!r}"
            )
        return {s.name: p for s, p in zip(stages, params, strict=True)}

    def _run(self, requests: list[PromptInput], params: dict[str, SamplingParams], per_stage: bool = False):
        by_id = {r.request_id: r for r in requests}
        results: dict[str, dict[str, StageResult]] = {r.request_id: {} for r in requests}
        remaining = set(by_id)
        timeout = self.config.runtime.request_timeout_s
        final = self.config.final_stage.name

        def route(result: StageResult) -> list[StageResult]:
            """Record a result; submit to every consumer whose inputs are all complete."""
            request = by_id[result.request_id]
            got = results[result.request_id]
            got[result.stage] = result
            immediate = []
            if result.error is not None:
                return immediate
            for consumer in self.config.consumers(result.stage):
                if not all(name in got for name in consumer.inputs):
                    continue
                upstream = {name: got[name] for name in consumer.inputs}
                try:
                    processor = get_input_processor(consumer.input_processor)
                    stage_input = processor(upstream, request)
                    stage_input.sampling_params = params[consumer.name]
                except Exception as e:  # a bad processor result fails this request alone
                    immediate.append(error_result(
                        StageInput(result.request_id, []), consumer.name,
                        f"input processor {consumer.input_processor!r} for stage {consumer.name!r} "
                        f"failed on request {result.request_id!r}: {type(e).__name__}: {e}",
                    ))
                    continue
                immediate.extend(self.clients[consumer.name].submit([stage_input]))
            return immediate

        def finish_if_done(result: StageResult) -> OmniOutput | None:
            got = results[result.request_id]
            if result.error is None and result.stage != final:
                return None
            if result.request_id not in remaining:
                return None
            remaining.discard(result.request_id)
            for stage_result in got.values():
                if stage_result.token_ids and stage_result.text is None and stage_result.error is None:
                    stage_result.text = self.prompt_processor.decode(stage_result.token_ids)
            return OmniOutput(
                request_id=result.request_id,
                stages=dict(got),
                final=result,
                prompt=by_id[result.request_id].original,
                error=result.error,
            )

        def handle(batch: list[StageResult]):
            queue = list(batch)
            while queue:
                result = queue.pop(0)
                queue.extend(route(result))
                if per_stage:
                    yield result
                output = finish_if_done(result)
                if output is not None and not per_stage:
                    yield output

        for root in self.config.root_stages:
            inputs = [
                StageInput(
                    r.request_id, r.prompt_token_ids, params[root.name], r.mm_inputs, r.cache_salt, dict(r.extras)
                )
                for r in requests
            ]
            yield from handle(self.clients[root.name].submit(inputs))
        last_progress = time.monotonic()
        while remaining:
            progressed = False
            for name in self.order:
                batch = self.clients[name].poll(timeout_s=0.05)
                if batch:
                    progressed = True
                    yield from handle(batch)
            if progressed:
                last_progress = time.monotonic()
            elif time.monotonic() - last_progress > timeout:
                raise TimeoutError(
                    f"no stage produced a result for {timeout:.0f} s (runtime.request_timeout_s); "
                    f"unfinished requests: {sorted(remaining)[:8]}"
                )


def _resolve_config(config: Any, model: str | None, overrides: dict[str, Any]) -> OmniConfig:
    if isinstance(config, OmniConfig):
        if overrides:
            return load_config(config.to_dict(), overrides)
        return config
    if config is None:
        if model is None:
            raise ValueError("Omni needs a config (YAML path or dict) or model=<checkpoint directory>")
        return config_for_model(model, overrides or None)
    return load_config(config, overrides or None, {"MODEL": model} if model else None)


class _NoProgress:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def _progress(total: int, enabled: bool):
    if not enabled:
        return _NoProgress()
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="omni.generate", unit="req", dynamic_ncols=True)
