"""AsyncOmni: the API every entry point uses. One always-on pipeline, any number of callers.

    async with AsyncOmni(model="path/to/Qwen2.5-Omni") as async_omni:
        async for out in async_omni.generate("Hello", SamplingParams(max_tokens=32)):
            print(out.final.text)  # grows after every engine step; out.finished on the last

`generate` validates and tokenizes the prompt on the caller's thread, hands it to the pipeline's
driver (omni/driver/), and yields the snapshots the driver sends for this request. Requests of
all callers are batched continuously in every stage. Leaving the `async for` early, or cancelling
the task, aborts the request in every stage.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import os
import threading
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from typing import Any

from omni.config import OmniConfig, config_for_model, load_config
from omni.core.sampling_params import SamplingParams
from omni.driver import PipelineDriver
from omni.engine.prompt_processor import PromptProcessor, load_tokenizer, text_decoder
from omni.entrypoints.request_stream import RequestStream
from omni.entrypoints.token_text import TokenText
from omni.messages import OmniOutput, PromptInput
from omni.registry import family_of, get_prompt_processor, produces_text

StageParams = SamplingParams | Sequence[SamplingParams] | None


class AsyncOmni:
    def __init__(
        self,
        config: str | os.PathLike[str] | dict[str, Any] | OmniConfig | None = None,
        *,
        model: str | None = None,
        variables: dict[str, str] | None = None,
        **overrides: Any,
    ) -> None:
        """config: a stage-config YAML path, an equivalent dict or an OmniConfig; model: a
        checkpoint directory (picks the stage config of the family claiming its model_type
        without a config, and is ${MODEL} in one); variables: more ${NAME} values; overrides: dotted keys or nested
        dicts, e.g. runtime={"backend": "local"} or **{"stages.llm.engine.num_blocks": 64}."""
        self.config = resolve_config(config, model, variables, overrides)
        root = self.config.root_stages[0]
        self.prompt_processor: PromptProcessor = get_prompt_processor(root.adapter)(root.model)
        # Tokenizers are not safe to use from two threads at once (callers encode, the driver
        # decodes every step).
        self._tokenizer_lock = threading.Lock()
        self._tokenizers: dict[str, Any] = {root.name: self.prompt_processor.tokenizer}
        self._decoders: dict[str, Callable[[list[int]], str | None]] = {}
        self._token_texts: dict[str, TokenText | None] = {}
        self._ids = itertools.count(1)
        self.driver: PipelineDriver | None = None
        self.driver = PipelineDriver(self.config, self._decode)

    # ---- requests -----------------------------------------------------------------------------
    async def generate(
        self,
        prompt: Any,
        sampling_params: StageParams = None,
        *,
        request_id: str | None = None,
        final_stage: str | None = None,
        stream_audio: bool = False,
    ) -> AsyncIterator[OmniOutput]:
        """Snapshots of one request after every engine step that advanced it; the last has
        `finished=True`. `final_stage` ends the request at that stage (e.g. `text_stage`: text
        without speech). Bad input raises ValueError first. stream_audio: the caller receives audio as it is produced. True: the streaming path:
        stages with `stream.enabled` start before their upstream has finished and the vocoder
        decodes in chunks, so the audio stage's `audio` grows snapshot by snapshot
        (docs/streaming.md). False (the default): the whole-sequence path, whose waveform
        equals transformers' `generate`; the chunked vocoder (within 1e-2 of it) is what a caller
        who plays audio as it comes opts into, under this one name and default in every API."""
        request = self.prepare(prompt, request_id)
        params = self.stage_params(sampling_params)
        run = self.run(request, params, final_stage=final_stage, stream_audio=stream_audio)
        # Closing this generator must close the inner one now (it aborts), not at its collection.
        async with contextlib.aclosing(run) as outputs:
            async for output in outputs:
                yield output

    async def run(
        self,
        request: PromptInput,
        params: dict[str, SamplingParams],
        *,
        final_stage: str | None = None,
        step_snapshots: bool = True,
        stream_audio: bool = False,
    ) -> AsyncGenerator[OmniOutput, None]:
        """`generate` for a prepared request (see `prepare` and `stage_params`); stream_audio as
        generate's. step_snapshots: the caller receives a snapshot after every step that
        advanced the request (True, as generate); False: only when a stage finishes (no
        per-step text decoding), for callers that want only the end (`Omni.generate`, a
        non-streamed server response). Named apart from stream_audio because it is a separate
        choice: per-step text of the whole-sequence path, or streamed audio seen only at the
        end, are both valid."""
        outputs = RequestStream(asyncio.get_running_loop())
        self._driver().add(
            request,
            params,
            outputs.push,
            final_stage=final_stage,
            step_snapshots=step_snapshots,
            stream_audio=stream_audio,
        )
        try:
            while True:
                output = await outputs.get()
                yield output
                if output.finished:
                    return
        finally:
            if not outputs.finished and self.driver is not None:
                self.driver.abort(request.request_id)

    async def abort(self, request_id: str) -> bool:
        """Stop a request in every stage and free its blocks; False if it is not running.
        Its `generate` ends with a finished snapshot whose final result is "aborted"."""
        return self._driver().abort(request_id, f"request {request_id!r} was aborted")

    def prepare(self, prompt: Any, request_id: str | None = None) -> PromptInput:
        """Validate and tokenize one prompt (ValueError naming the field and the value)."""
        if request_id is None:
            request_id = f"req-{next(self._ids)}"
        elif not isinstance(request_id, str) or not request_id:
            raise ValueError(f"request_id must be a non-empty string, got {request_id!r}")
        with self._tokenizer_lock:
            return self.prompt_processor(request_id, prompt)

    def tokenize(self, text: str) -> list[int]:
        """`text` in the root stage's vocabulary (no special tokens added), thread-safe."""
        with self._tokenizer_lock:
            return list(self.prompt_processor.tokenizer.encode(text, add_special_tokens=False))

    def stage_params(self, params: StageParams) -> dict[str, SamplingParams]:
        """Per-stage SamplingParams: the stages' defaults, one for all, or one per stage. A
        json_schema constrains text: one for all leaves it out of the stages that make none
        (codes, audio); one per stage with it on such a stage is a ValueError."""
        stages = self.config.stages
        if params is None:
            return {s.name: s.sampling for s in stages}
        if isinstance(params, SamplingParams):
            plain = dataclasses.replace(params, json_schema=None)
            return {s.name: params if _is_text(self.config, s.name) else plain for s in stages}
        names = [s.name for s in stages]
        expected = f"sampling_params must be one SamplingParams or a list of {len(stages)} "
        expected += f"(one per stage: {names})"
        # Only a list or tuple is taken apart: a str (or any other iterable) is one bad value.
        if not isinstance(params, list | tuple):
            raise ValueError(f"{expected}, got {_show(params)}")
        if len(params) != len(stages):
            raise ValueError(f"{expected}, got a {type(params).__name__} of {len(params)}")
        for index, (p, stage) in enumerate(zip(params, stages, strict=True)):
            if not isinstance(p, SamplingParams):
                raise ValueError(f"{expected}, got {_show(p)} at index {index}")
            if p.json_schema is not None and not _is_text(self.config, stage.name):
                raise ValueError(
                    f"sampling_params[{index}].json_schema: stage {stage.name!r} makes no text"
                )
        return {s.name: p for s, p in zip(stages, params, strict=True)}

    # ---- the pipeline -------------------------------------------------------------------------
    @property
    def text_stage(self) -> str | None:
        """The last stage (in topological order) whose tokens are text: where a text-only
        request can end. None when no stage produces text."""
        names = [n for n in self.config.topological_order() if _is_text(self.config, n)]
        return names[-1] if names else None

    @property
    def audio_stage(self) -> str | None:
        """The final stage when it is a generation stage (a vocoder: results carry audio)."""
        final = self.config.final_stage
        return final.name if final.kind == "generation" else None

    @property
    def voices(self) -> list[str]:
        """Speakers a prompt may pick with {"speaker": NAME} (empty: no speech, or one voice)."""
        return list(self.prompt_processor.voices)

    @property
    def default_voice(self) -> str | None:
        """The voice of a prompt that names no speaker (None: the model has no named voices)."""
        return self.prompt_processor.default_voice

    @property
    def sample_rate(self) -> int | None:
        """The audio sample rate the root stage's model family declares (ModelFamily.sample_rate)
        for results that carry none; None for families without audio."""
        family = family_of(self.config.root_stages[0].adapter)
        return None if family is None else family.sample_rate

    def stats(self) -> dict[str, dict[str, Any]]:
        """Per-stage engine statistics (steps, prefix-cache queries and hits, output cache)."""
        return self._driver().stats()

    async def check_health(self) -> list[str]:
        """Returns if every stage answers (a stage with a replica up does), with the replicas
        that are down; raises RuntimeError naming a dead stage otherwise."""
        return await asyncio.to_thread(self._driver().check_health)

    @property
    def num_requests(self) -> int:
        """Requests running now."""
        return self._driver().num_requests

    def shutdown(self) -> None:
        """Stop every stage (and a Ray instance this engine started). Safe to call twice."""
        driver, self.driver = self.driver, None
        if driver is not None:
            driver.shutdown()

    async def __aenter__(self) -> AsyncOmni:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.shutdown)

    def _driver(self) -> PipelineDriver:
        if self.driver is None:
            raise RuntimeError("this engine has been shut down")
        return self.driver

    def _decode(self, stage: str, token_ids: list[int]) -> str | None:
        """Text in the stage's own vocabulary; None for stages whose tokens are not text.
        Twice per request and step from the driver: the stage's decoder is looked up once."""
        decode = self._decoders.get(stage)
        if decode is None:
            decode = self._decoder(stage)
        with self._tokenizer_lock:
            return decode(token_ids)

    def _decoder(self, stage: str) -> Callable[[list[int]], str | None]:
        with self._tokenizer_lock:
            decode = self._decoders.get(stage)
            if decode is not None:
                return decode
            text = produces_text(self.config.stage(stage).adapter)
            decode = text_decoder(self._tokenizer(stage)) if text else _no_text
            self._decoders[stage] = decode
            return decode

    def token_texts(self, stage: str, token_ids: list[int]) -> list[tuple[str, list[int]]]:
        """Each token's (text, bytes) in the stage's vocabulary, as logprobs show them
        (omni/entrypoints/token_text.py); ("", []) each for a stage without a tokenizer."""
        with self._tokenizer_lock:
            texts = self._token_texts.get(stage)
            if texts is None:
                tokenizer = self._tokenizer(stage)
                texts = TokenText(tokenizer) if tokenizer is not None else None
                self._token_texts[stage] = texts
            return [texts(t) if texts else ("", []) for t in token_ids]

    def _tokenizer(self, stage: str) -> Any:
        """The stage's tokenizer (loaded once; None when it has none). Under _tokenizer_lock."""
        if stage not in self._tokenizers:  # the root's is the prompt processor's
            try:
                self._tokenizers[stage] = load_tokenizer(self.config.stage(stage).model)
            except (OSError, ValueError, KeyError):
                self._tokenizers[stage] = None  # e.g. a vocoder or codec stage
        return self._tokenizers[stage]


def _no_text(token_ids: list[int]) -> None:
    return None


def _show(value: object) -> str:
    """repr (cut at 80 characters) and type, for error messages."""
    text = repr(value)
    text = text if len(text) <= 80 else text[:77] + "..."
    return f"{text} ({type(value).__name__})"


def resolve_config(
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


def _is_text(config: OmniConfig, stage: str) -> bool:
    return produces_text(config.stage(stage).adapter)
