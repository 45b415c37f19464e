"""RequestState: one live request as the router tracks it, and the outputs built from it.

It records what each stage reported (tokens so far, finished results with their payloads, pipeline
timings) and turns that into the OmniOutput snapshots the caller receives. It never talks to a
backend: routing decisions stay in the Router.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from omni.core.logprobs import TokenLogprobs
from omni.core.sampling_params import SamplingParams
from omni.driver.incremental_text import IncrementalText
from omni.driver.stop_strings import StopStrings, stopped_tokens
from omni.messages import OmniOutput, PromptInput, StageResult, StageUpdate

Sink = Callable[[OmniOutput], None]
Decode = Callable[[str, list[int]], str | None]
ROUTED_EXTRA_MAX_BYTES = 64 << 10


@dataclass
class RequestState:
    """A live request: where it is, what it has produced so far, and who listens."""

    prompt: PromptInput
    """The prompt as the stages know it (request_id: the stage id)."""
    user_id: str
    """The request id its caller gave or got."""
    params: dict[str, SamplingParams]
    sink: Sink
    final: str
    """The stage whose result completes the request (the pipeline's final stage, or earlier)."""
    step_snapshots: bool = True
    """Send a snapshot after every step that advanced it (else only when a stage finishes): the
    one name for "the caller receives per-step snapshots" (AsyncOmni.run)."""
    inflight: set[str] = field(default_factory=set)
    payloads: dict[str, Any] = field(default_factory=dict)  # finished stage -> payload
    results: dict[str, StageResult] = field(default_factory=dict)  # finished, full
    tokens: dict[str, list[int]] = field(default_factory=dict)  # running stage -> tokens so far
    num_cached: dict[str, int] = field(default_factory=dict)
    texts: dict[str, IncrementalText] = field(default_factory=dict)
    added: float = field(default_factory=time.monotonic)
    last_progress: float = field(default_factory=time.monotonic)
    first_token_s: dict[str, float] = field(default_factory=dict)  # stage -> since added
    started_s: dict[str, float] = field(default_factory=dict)  # stage -> routed, since added
    stream_audio: bool = False
    """The streaming path (AsyncOmni.generate's stream_audio): streaming edges start their
    consumer early and vocoders send audio in chunks."""
    # stage -> its step-row payloads so far, each with its number of rows (never the rows)
    rows: dict[str, list[tuple[Any, int]]] = field(default_factory=dict)
    streamed: dict[str, int] = field(default_factory=dict)  # consumer -> upstream tokens sent
    rows_streamed: dict[str, tuple[int, int]] = field(default_factory=dict)  # (parts, rows) sent
    # stage -> the residual codes of each token so far (multi-code stages; kept after it finished:
    # its streaming consumers' last piece needs them)
    codes: dict[str, list[tuple[int, ...]]] = field(default_factory=dict)
    audio: dict[str, list[Any]] = field(default_factory=dict)  # stage -> waveform chunks so far
    logprobs: dict[str, list[TokenLogprobs]] = field(default_factory=dict)  # stage -> so far
    sample_rate: dict[str, int] = field(default_factory=dict)
    first_audio_s: float | None = None
    _decoded: dict[str, tuple[int, str | None]] = field(default_factory=dict)  # _text's memo
    stop: StopStrings | None = None
    """The final stage's stop strings (stop_strings.py), matched on its text after each step."""

    def start(self, stage: str) -> None:
        """The request was routed to `stage` (whole or streaming): in flight there now."""
        self.inflight.add(stage)
        self.started_s.setdefault(stage, time.monotonic() - self.added)

    # ---- what the stages report -----------------------------------------------------------------
    def record_update(self, update: StageUpdate) -> None:
        self.tokens.setdefault(update.stage, []).extend(update.new_token_ids)
        self.num_cached[update.stage] = update.num_cached_tokens
        self.last_progress = time.monotonic()
        if update.new_token_ids:
            self.first_token_s.setdefault(update.stage, self.last_progress - self.added)
        if update.new_codes:
            self.codes.setdefault(update.stage, []).extend(update.new_codes)
        if update.new_logprobs:
            self.logprobs.setdefault(update.stage, []).extend(update.new_logprobs)
        if update.rows is not None:
            self.rows.setdefault(update.stage, []).append((update.rows, update.num_rows))
        if update.audio is not None:
            self.audio.setdefault(update.stage, []).append(update.audio)
            if update.sample_rate:
                self.sample_rate[update.stage] = update.sample_rate
            if self.first_audio_s is None and len(update.audio):
                self.first_audio_s = self.last_progress - self.added

    def record_finished(self, full: StageResult, payload: Any, decode: Decode) -> StageResult:
        """Keep a stage's result, full or light (the caller's id, decoded text, pipeline
        timings)."""
        stage = full.stage
        self.inflight.discard(stage)
        self.tokens.pop(stage, None)
        self.last_progress = time.monotonic()
        self.payloads[stage] = payload
        # Pipeline times (since the request was added) beside the stage's own latency.
        timings = {**full.timings, "finished_s": self.last_progress - self.added}
        if stage in self.first_token_s:
            timings["first_token_s"] = self.first_token_s[stage]
        if stage in self.started_s:
            timings["started_s"] = self.started_s[stage]
        self.rows.pop(stage, None)
        self.audio.pop(stage, None)
        self.logprobs.pop(stage, None)
        if full.audio is not None and full.sample_rate:
            # Streamed: when the first chunk came; whole-sequence vocoding: the first audio is
            # all of it. RTF: the request's time in the pipeline per second of audio.
            first = self.first_audio_s if self.first_audio_s is not None else timings["finished_s"]
            timings["first_audio_s"] = first
            seconds = full.audio.numel() / full.sample_rate
            if seconds > 0:
                timings["rtf"] = timings["finished_s"] / seconds
        result = dataclasses.replace(full, request_id=self.user_id, timings=timings)
        if result.token_ids and result.text is None and result.error is None:
            result = dataclasses.replace(result, text=decode(stage, result.token_ids))
        self.results[stage] = result
        return result

    def stop_result(self, root: bool, decode: Decode) -> StageResult | None:
        """The final stage's result cut at the first stop string its text now holds (the tokens
        through the one that completed it, the text before it), or None. root: the stage reads
        the request's prompt (else its prompt is its upstream's, unknown here)."""
        stage, tokens = self.final, self.tokens.get(self.final)
        if self.stop is None or not tokens:
            return None
        text = self._text(stage, decode)
        found = None if text is None else self.stop.find(text)
        if text is None or found is None or len(tokens) < self.stop.min_tokens:
            return None
        num_tokens = stopped_tokens(tokens, found[1], lambda ids: decode(stage, ids))
        logprobs = self.logprobs.get(stage)
        prompt_token_ids = list(self.prompt.prompt_token_ids) if root else []
        return StageResult(
            self.prompt.request_id, stage, prompt_token_ids, tokens[:num_tokens], "stopped",
            num_cached_tokens=self.num_cached.get(stage, 0),
            text=text[: found[1] if self.stop.include else found[0]],
            logprobs=None if logprobs is None else logprobs[:num_tokens],
        )  # fmt: skip

    def record_failure(self, stage: str, error: str, finish_reason: str) -> StageResult:
        """The result that ends the request; which stages still run it is the router's call."""
        result = StageResult(self.user_id, stage, [], [], finish_reason=finish_reason, error=error)
        self.results[stage] = result
        return result

    # ---- what the caller receives ---------------------------------------------------------------
    def snapshot(self, order: list[str], decode: Decode) -> OmniOutput:
        """Every stage so far: finished results, and partial ones (tokens, streamed text)."""
        stages: dict[str, StageResult] = {}
        for name in order:
            if name in self.results:
                stages[name] = self.results[name]
            elif name in self.tokens:
                stages[name] = self._partial(name, decode)
        final = stages[next(name for name in reversed(order) if name in stages)]
        return OmniOutput(self.user_id, stages, final, prompt=self.prompt.original, finished=False)

    def output(self, order: list[str], error: StageResult | None) -> OmniOutput:
        """The finished output: the final stage's result, or the one that failed it."""
        stages = {name: self.results[name] for name in order if name in self.results}
        return OmniOutput(
            request_id=self.user_id,
            stages=stages,
            final=error if error is not None else stages[self.final],
            prompt=self.prompt.original,
            error=error.error if error is not None else None,
            finished=True,
        )

    def routed_prompt(self) -> PromptInput:
        """The request as edges see it: without the user's raw prompt (e.g. PIL images) and the
        root stage's large encoder inputs, which downstream stages never read."""
        extras = self.prompt.extras.items()
        small = {k: v for k, v in extras if _nbytes(v) <= ROUTED_EXTRA_MAX_BYTES}
        return dataclasses.replace(self.prompt, original=None, extras=small)

    def _text(self, stage: str, decode: Decode) -> str | None:
        """The stage's text so far (decoded incrementally, once per new token count: a stop
        check and a snapshot after the same step share it)."""
        texts = self.texts.get(stage)
        if texts is None:
            texts = self.texts[stage] = IncrementalText()
        tokens = self.tokens[stage]
        known = self._decoded.get(stage)
        if known is not None and known[0] == len(tokens):
            return known[1]
        text = texts.update(tokens, lambda token_ids: decode(stage, token_ids))
        self._decoded[stage] = (len(tokens), text)
        return text

    def _partial(self, stage: str, decode: Decode) -> StageResult:
        tokens = self.tokens[stage]
        text = self._text(stage, decode)
        if text is not None and self.stop is not None and stage == self.final:
            text = self.stop.held_back(text)  # never part of a stop string
        chunks = self.audio.get(stage)
        return StageResult(
            self.user_id,
            stage,
            [],
            list(tokens),
            finish_reason=None,
            num_cached_tokens=self.num_cached.get(stage, 0),
            text=text,
            audio=_joined(chunks) if chunks else None,
            sample_rate=self.sample_rate.get(stage),
            timings={} if self.first_audio_s is None else {"first_audio_s": self.first_audio_s},
            logprobs=list(self.logprobs[stage]) if stage in self.logprobs else None,
        )


def _joined(chunks: list[Any]) -> Any:
    """The waveform so far; kept joined so that each snapshot costs one concatenation."""
    if len(chunks) > 1:
        chunks[:] = [torch.cat(chunks)]
    return chunks[0]


def _nbytes(value: Any) -> int:
    if isinstance(value, list | tuple):
        return sum(_nbytes(v) for v in value)
    return int(getattr(value, "nbytes", 0))
