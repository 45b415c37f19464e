"""Omni: the synchronous API, a thin wrapper over AsyncOmni running on a background event loop.

    with Omni(model="path/to/checkpoint") as llm:
        outputs = llm.generate(["Hello", "The capital of France is"], SamplingParams(max_tokens=16))

Any number of threads may call `generate`/`stream` on one instance at once: every call's requests
join the same always-on pipeline and are batched with everyone else's.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import queue
import threading
from collections.abc import Coroutine, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from omni.config import OmniConfig
from omni.core.sampling_params import SamplingParams
from omni.entrypoints.async_omni import AsyncOmni, StageParams
from omni.entrypoints.media_parts import MediaError, MediaPolicy
from omni.entrypoints.snapshot_cursor import SnapshotCursor
from omni.messages import OmniOutput, PromptInput, StageResult

if TYPE_CHECKING:
    import torch

T = TypeVar("T")
WAIT_S = 0.5  # longest single wait on the loop; a wait never outlives a dead loop thread


class Omni:
    def __init__(
        self,
        config: str | os.PathLike[str] | dict[str, Any] | OmniConfig | None = None,
        *,
        model: str | None = None,
        variables: dict[str, str] | None = None,
        **overrides: Any,
    ) -> None:
        """The same arguments as AsyncOmni (config, model, variables, overrides)."""
        # The AsyncOmni this wraps; its coroutines run on the loop thread started below.
        self.async_omni = AsyncOmni(config, model=model, variables=variables, **overrides)
        self.config = self.async_omni.config
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="omni-event-loop", daemon=True
        )
        self._thread.start()

    @property
    def prompt_processor(self) -> Any:
        return self.async_omni.prompt_processor

    @property
    def order(self) -> list[str]:
        """Stage names, every stage after its inputs."""
        return self.config.topological_order()

    @property
    def backend(self) -> Any:
        """The running StageBackend (its hosts or actors: for inspection and tests)."""
        return self.async_omni._driver().backend

    # ---- public API ---------------------------------------------------------------------------
    def generate(
        self,
        prompts: Any,
        sampling_params: StageParams = None,
        *,
        use_tqdm: bool = True,
        stream_audio: bool = False,
    ) -> list[OmniOutput]:
        """One OmniOutput per prompt, in prompt order. Every prompt is checked before any runs.
        A request that fails in some stage comes back with .error set (naming the request and
        the stage); the others are unaffected. stream_audio as AsyncOmni.generate's (default
        False: the whole-sequence path, whose waveform equals transformers' `generate`); True
        runs the streaming path (talker started early, vocoder in chunks) for its timings
        (`first_audio_s`): the outputs come only at the end either way."""
        requests, params = self._prepare(prompts, sampling_params)
        progress = _progress(len(requests), use_tqdm)

        async def one(request: PromptInput) -> OmniOutput:
            run = self.async_omni.run(
                request, params, step_snapshots=False, stream_audio=stream_audio
            )
            outputs = [output async for output in run]
            progress.update(1)
            return outputs[-1]

        async def every() -> list[OmniOutput]:
            return list(await asyncio.gather(*(one(r) for r in requests)))

        try:
            return self._call(every())
        finally:
            progress.close()

    def chat(
        self,
        messages: Sequence[Mapping[str, Any]] | Sequence[Sequence[Mapping[str, Any]]],
        sampling_params: StageParams = None,
        *,
        tools: list[dict[str, Any]] | None = None,
        use_tqdm: bool = True,
    ) -> list[OmniOutput]:
        """`generate` for chat-format input: one conversation (a list of OpenAI-style messages,
        `{"role": ..., "content": str or parts}`) or a list of them. The prompt is the model
        family's chat framing (the tokenizer's chat template, else ChatML); image and audio parts
        may be data: URLs or local paths. `tools` (OpenAI's function tools) go to the framing, as
        the server's; the reply is not read for calls here."""
        if not isinstance(messages, Sequence) or isinstance(messages, str) or not messages:
            raise ValueError(f"messages must be a non-empty list of messages, got {messages!r}")
        conversations: list[Any] = (
            [messages] if isinstance(messages[0], Mapping) else list(messages)
        )
        prompts = [self.chat_prompt(conversation, tools) for conversation in conversations]
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm)

    def chat_prompt(
        self, messages: Sequence[Mapping[str, Any]], tools: list[dict[str, Any]] | None = None
    ) -> dict[str, Any]:
        """The prompt dict `chat` builds for one conversation (ValueError naming a bad part),
        framed by the model family's prompt processor."""
        # Here, not at the top: the message models need pydantic (a server extra), generate not.
        from omni.entrypoints.chat_messages import chat_prompt

        processor = self.async_omni.prompt_processor
        if processor.tokenizer is None:
            raise ValueError("this model has no tokenizer: chat needs one; use generate with ids")
        local_files = MediaPolicy(allowed_local_media_path=os.sep)
        try:
            return chat_prompt(processor, [dict(m) for m in messages], local_files, tools)
        except MediaError:
            raise
        except ValueError as e:  # the message models' own validation (pydantic)
            raise ValueError(f"messages: {e}") from None

    def stream(
        self, prompts: Any, sampling_params: StageParams = None, *, stream_audio: bool = False
    ) -> Iterator[StageResult]:
        """Every stage's result of every request as soon as that stage finishes it (the final
        stage's result last for each request). Leaving the loop early aborts what is left.

        stream_audio as AsyncOmni.generate's. True: the streaming path, and the audio comes as
        it is decoded: before an audio stage's finished result come partial results of that
        stage (finish_reason None) whose `audio` is only the samples new since the previous
        one. Joined in order, they are the finished result's whole `audio`, so a player plays
        the partials and keeps the finished result for its timings. False (the default): only
        finished results, from the whole-sequence path (the waveform transformers produces)."""
        requests, params = self._prepare(prompts, sampling_params)
        results: queue.Queue[StageResult | None] = queue.Queue()

        async def one(request: PromptInput) -> None:
            seen: set[str] = set()
            cursor = SnapshotCursor()  # the audio already yielded as partials
            # Per-step snapshots carry the chunks (a snapshot per finished stage would not).
            run = self.async_omni.run(
                request, params, step_snapshots=stream_audio, stream_audio=stream_audio
            )
            async with contextlib.aclosing(run) as outputs:
                async for output in outputs:
                    new_audio = cursor.advance(output).audio if stream_audio else {}
                    for name, result in output.stages.items():
                        if name in seen:
                            continue
                        if name in new_audio:
                            results.put(_partial(result, new_audio[name]))
                        if result.finished:
                            seen.add(name)
                            results.put(result)

        async def every() -> None:
            try:
                await asyncio.gather(*(one(r) for r in requests))
            finally:
                results.put(None)

        future = asyncio.run_coroutine_threadsafe(every(), self._loop)
        try:
            while True:
                item = self._get(results)
                if item is None:
                    future.result(timeout=WAIT_S)  # re-raises what ended the requests
                    return
                yield item
        finally:
            future.cancel()  # an abandoned stream: the requests' generators abort them

    def stats(self) -> dict[str, dict[str, Any]]:
        """Per-stage engine statistics (steps, prefix-cache queries and hits, output cache);
        a stage with replicas: their sum, and each replica's as `stage/i`."""
        return self.async_omni.stats()

    def check_health(self) -> list[str]:
        """Returns if every stage answers (a stage with a replica up does), with the replicas
        that are down; raises RuntimeError naming a dead stage otherwise."""
        result: list[str] = self._call(self.async_omni.check_health())
        return result

    def shutdown(self) -> None:
        """Stop every stage (and a Ray instance this Omni started). Safe to call twice."""
        self.async_omni.shutdown()
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)

    def __enter__(self) -> Omni:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # ---- internals ----------------------------------------------------------------------------
    def _prepare(
        self, prompts: Any, sampling_params: StageParams
    ) -> tuple[list[PromptInput], dict[str, SamplingParams]]:
        if self.async_omni.driver is None:
            raise RuntimeError("this Omni has been shut down")
        if isinstance(prompts, str | dict) or (
            isinstance(prompts, list | tuple) and prompts and isinstance(prompts[0], int)
        ):
            prompts = [prompts]
        if not isinstance(prompts, list | tuple) or not prompts:
            raise ValueError(
                f"prompts must be a prompt or a non-empty list of prompts, got {prompts!r}"
            )
        params = self.async_omni.stage_params(sampling_params)
        return [self.async_omni.prepare(prompt) for prompt in prompts], params

    def _call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine on the loop thread and wait for it (Ctrl-C cancels it)."""
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        try:
            while True:
                try:
                    return future.result(timeout=WAIT_S)
                except TimeoutError:
                    if not self._thread.is_alive():
                        raise RuntimeError("omni's event loop thread is gone") from None
        finally:
            future.cancel()

    def _get(self, results: queue.Queue[StageResult | None]) -> StageResult | None:
        while True:
            try:
                return results.get(timeout=WAIT_S)
            except queue.Empty:
                if not self._thread.is_alive():
                    raise RuntimeError("omni's event loop thread is gone") from None


def _partial(result: StageResult, new_audio: torch.Tensor) -> StageResult:
    """`result` as a partial result (finish_reason None) holding only `new_audio`, the samples
    its snapshot added (SnapshotCursor: joined in order, the finished result's waveform)."""
    return dataclasses.replace(
        result, finish_reason=None, audio=new_audio, tensors={}, prompt_token_ids=[]
    )


class _NoProgress:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def _progress(total: int, enabled: bool) -> Any:
    if not enabled:
        return _NoProgress()
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="omni.generate", unit="req", dynamic_ncols=True)
