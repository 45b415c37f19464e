"""Omni: the public API. Builds the stages from a config on a backend and runs requests.

Data flow: generate()/stream() normalize the prompts (omni/inputs.py: PromptProcessor) and hand
them to a Router (omni/routing.py), which feeds the root stages and routes every finished result
along the stage graph through the backend (omni/stage_client.py: LocalBackend, in-process;
omni/ray_backend.py: RayBackend, one StageActor per stage). See docs/architecture.md.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Sequence
from typing import Any

from omni.config import OmniConfig, config_for_model, load_config
from omni.core.sampling_params import SamplingParams
from omni.inputs import PromptInput, PromptProcessor
from omni.outputs import OmniOutput, StageResult
from omni.routing import Router
from omni.stage_client import LocalBackend, Processor, StageBackend
from stages.registry import get_input_processor, get_prompt_processor, produces_text

logger = logging.getLogger(__name__)


class Omni:
    """A pipeline of stages; one generate()/stream() call at a time (not thread-safe)."""

    def __init__(
        self,
        config: str | os.PathLike | dict | OmniConfig | None = None,
        *,
        model: str | None = None,
        variables: dict[str, str] | None = None,
        **overrides: Any,
    ) -> None:
        """config: a stage-config YAML path, an equivalent dict or an OmniConfig; model: a
        checkpoint directory (picks stage_configs/<model_type>.yaml without a config, and is
        ${MODEL} in one); variables: more ${NAME} values; overrides: dotted keys or nested
        dicts, e.g. runtime={"backend": "local"} or **{"stages.llm.engine.num_blocks": 64}."""
        self.config = _resolve_config(config, model, variables, overrides)
        self.order = self.config.topological_order()
        root = self.config.root_stages[0]
        self.prompt_processor: PromptProcessor = get_prompt_processor(root.adapter)(root.model)
        self._tokenizers: dict[str, Any] = {root.name: self.prompt_processor.tokenizer}
        self._counter = 0
        self.backend: StageBackend | None = None
        self.backend = self._start_stages()

    def _start_stages(self) -> StageBackend:
        # Processors are resolved here, where they were registered, and shipped to the stages:
        # a stage actor need not import the module that registered its processor.
        processors: dict[str, Processor] = {
            s.input_processor: get_input_processor(s.input_processor)
            for s in self.config.stages
            if s.input_processor is not None
        }
        if self.config.runtime.backend == "local":
            return LocalBackend(self.config, self.order, processors)
        from omni.ray_backend import start_ray_stages

        return start_ray_stages(self.config, self.order, processors)

    # ---- public API ---------------------------------------------------------------------------
    def generate(
        self,
        prompts: Any,
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        use_tqdm: bool = True,
    ) -> list[OmniOutput]:
        """One OmniOutput per prompt, in prompt order. A request that fails in some stage comes
        back with .error set (naming the request and the stage); the others are unaffected."""
        requests = self._prepare(prompts)
        router = self._router(requests, sampling_params)
        done: dict[str, OmniOutput] = {}
        progress = _progress(len(requests), use_tqdm)
        try:
            for output in router.run():
                done[output.request_id] = output
                progress.update(1)
        finally:
            progress.close()
        return [done[r.request_id] for r in requests]

    def stream(
        self,
        prompts: Any,
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> Iterator[StageResult]:
        """Every stage's result of every request, as soon as that stage finishes it (the final
        stage's result last for each request). Leaving the loop early aborts what is left."""
        requests = self._prepare(prompts)
        yield from self._router(requests, sampling_params).run(per_stage=True)

    def stats(self) -> dict[str, dict]:
        """Per-stage engine statistics (steps, prefix-cache queries and hits, output cache)."""
        return self._backend().stats()

    def shutdown(self) -> None:
        """Stop every stage (and a Ray instance this Omni started). Safe to call twice."""
        backend, self.backend = self.backend, None
        if backend is not None:
            backend.shutdown()

    def __enter__(self) -> Omni:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # ---- internals ----------------------------------------------------------------------------
    def _backend(self) -> StageBackend:
        if self.backend is None:
            raise RuntimeError("this Omni has been shut down")
        return self.backend

    def _router(self, requests: list[PromptInput], params: Any) -> Router:
        stage_params = self._stage_params(params)
        return Router(self.config, self._backend(), requests, stage_params, self._decode)

    def _decode(self, stage: str, token_ids: list[int]) -> str | None:
        """Text in the stage's own vocabulary; None for stages whose tokens are not text."""
        if not produces_text(self.config.stage(stage).adapter):
            return None
        if stage not in self._tokenizers:
            from transformers import AutoTokenizer

            try:
                tokenizer = AutoTokenizer.from_pretrained(self.config.stage(stage).model)
            except (OSError, ValueError, KeyError):
                tokenizer = None  # e.g. a vocoder or codec stage
            self._tokenizers[stage] = tokenizer
        tokenizer = self._tokenizers[stage]
        return tokenizer.decode(token_ids, skip_special_tokens=True) if tokenizer else None

    def _prepare(self, prompts: Any) -> list[PromptInput]:
        if isinstance(prompts, str | dict) or (
            isinstance(prompts, list | tuple) and prompts and isinstance(prompts[0], int)
        ):
            prompts = [prompts]
        if not isinstance(prompts, list | tuple) or not prompts:
            raise ValueError(
                f"prompts must be a prompt or a non-empty list of prompts, got {prompts!r}"
            )
        requests = []
        for prompt in prompts:
            self._counter += 1
            requests.append(self.prompt_processor(f"req-{self._counter}", prompt))
        return requests

    def _stage_params(
        self, params: SamplingParams | Sequence[SamplingParams] | None
    ) -> dict[str, SamplingParams]:
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


def _resolve_config(
    config: Any, model: str | None, variables: dict[str, str] | None, overrides: dict[str, Any]
) -> OmniConfig:
    if isinstance(config, OmniConfig):
        if overrides:
            return load_config(config.to_dict(), overrides)
        return config
    if config is None:
        if model is None:
            raise ValueError(
                "Omni needs a config (YAML path or dict) or model=<checkpoint directory>"
            )
        return config_for_model(model, overrides or None)
    variables = {**({"MODEL": model} if model else {}), **(variables or {})}
    return load_config(config, overrides or None, variables or None)


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
