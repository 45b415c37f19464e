"""InputConversion: what a stage host receives -> what its engine takes.

A routed request (`RoutedInput`: upstream payloads and the original prompt) becomes a
`StageInput` through the edge's input processor; a streaming request's upstream pieces
(`RoutedDelta`) become `InputDelta`s through the edge's delta processor and reach the engine in
upstream order, each once (PieceOrder, omni/host/piece_order.py). A failure here fails its
request alone: conversion hands back (request id, why) and the host turns that into the error
result (the host is the only place that builds them).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from omni.config import StageConfig
from omni.engine import Engine
from omni.host.device_errors import fatal_device_error
from omni.host.piece_order import PieceOrder
from omni.messages import (
    DeferredRows,
    PromptInput,
    RoutedDelta,
    RoutedInput,
    StageInput,
    StageResult,
)
from omni.registry import get_delta_processor, get_edge_streaming

Processor = Callable[[dict[str, StageResult], PromptInput], StageInput]
"""An edge's input processor: upstream stage results + the original prompt -> this stage's input."""
Failure = tuple[str, str]
"""(request id, why) of a request that failed on its input."""


def error_message(e: BaseException) -> str:
    """A ValueError's message is written for the user; anything else also names its type."""
    return str(e) if isinstance(e, ValueError) else f"{type(e).__name__}: {e}"


class InputConversion:
    def __init__(
        self,
        config: StageConfig,
        processors: Mapping[str, Processor],
        resolve: Callable[[list[Any]], list[Any]],
    ) -> None:
        """resolve: payloads (upstream results, step rows) -> their values (in-process: the
        values themselves)."""
        self.name = config.name
        self.config = config
        self.processors = processors
        self._resolve = resolve
        self._pieces = PieceOrder()  # streaming requests' upstream pieces, in order
        # Streaming requests converted but not yet in the engine -> upstream tokens they cover.
        # Their pieces flow only once the engine holds them (`started`): a piece handed over
        # before would find no request (the host converts on Ray's call threads).
        self._offsets: dict[str, int] = {}

    def convert(
        self, items: Sequence[StageInput | RoutedInput | RoutedDelta]
    ) -> tuple[list[StageInput], list[Failure]]:
        """Stage inputs of the (routed) requests among items; pieces are left out."""
        accepted: list[StageInput] = []
        failed: list[Failure] = []
        for item in items:
            if isinstance(item, RoutedDelta):
                continue
            try:
                accepted.append(self._to_stage_input(item))
            except Exception as e:  # one bad item fails alone, never the whole submit
                failed.append((item.request_id, error_message(e)))
        return accepted, failed

    def _to_stage_input(self, item: StageInput | RoutedInput) -> StageInput:
        if isinstance(item, StageInput):
            return item
        names = list(item.upstream)
        if not item.input_complete:  # partial results travel by value, not as finished payloads
            upstream = dict(item.upstream)
            if item.rows is not None:  # (one upstream: a streaming edge)
                (name,) = names
                rows = self.rows(item.request_id, item.rows)
                upstream[name] = dataclasses.replace(upstream[name], tensors=rows)
        else:
            resolved = self._resolve([item.upstream[n] for n in names])
            upstream = dict(zip(names, resolved, strict=True))
        processor_name = self.config.input_processor
        if processor_name is None:
            raise ValueError(f"stage {self.name!r} has no input processor for routed inputs")
        try:
            stage_input = self.processors[processor_name](upstream, item.prompt)
            if not isinstance(stage_input, StageInput):
                raise TypeError(f"returned {type(stage_input).__name__}, expected StageInput")
        except Exception as e:  # a broken processor fails this request alone
            raise ValueError(
                f"input processor {processor_name!r} of stage {self.name!r} failed on request "
                f"{item.request_id!r}: {type(e).__name__}: {e}"
            ) from e
        if not item.input_complete:
            # The pieces go on from the first token the edge held back (EdgeStreaming).
            spec = get_edge_streaming(self.config.input_processor)
            held_back = spec.held_back if spec is not None else 0
            num_tokens = len(next(iter(upstream.values())).token_ids)
            self._offsets[item.request_id] = num_tokens - held_back
        # The router owns the request id, the per-stage sampling and streaming; the processor
        # the rest.
        return dataclasses.replace(
            stage_input,
            request_id=item.request_id,
            sampling_params=item.sampling_params,
            input_complete=item.input_complete,
            step_rows=item.step_rows,
        )

    def started(self, request_id: str) -> bool:
        """The engine now holds this request: its pieces may flow. Whether it streams."""
        offset = self._offsets.pop(request_id, None)
        if offset is not None:
            self._pieces.start(request_id, offset)
        return offset is not None

    def extend(
        self, engine: Engine, pieces: list[RoutedDelta], started_ids: Sequence[str] = ()
    ) -> list[Failure]:
        """Hand the engine every piece that is next in its request's upstream order (also those
        held for requests that just started); a piece that fails aborts its request alone (in
        the engine, before the next piece is handed)."""
        failed = []
        for item in self._pieces.ready(pieces, started_ids):
            request_id = item.request_id
            try:
                piece = item.piece
                if item.rows is not None:  # not fetched on arrival (see with_rows)
                    piece = dataclasses.replace(piece, tensors=self.rows(request_id, item.rows))
                delta = get_delta_processor(str(self.config.input_processor))(piece)
                engine.extend_request(delta)
            except Exception as e:
                if fatal_device_error(e) is not None:
                    raise  # the stage's end, not this request's (omni/host/device_errors.py)
                engine.abort([request_id])
                self._pieces.end(request_id)
                why = f"stage {self.name!r} failed on streamed input of request {request_id!r}"
                failed.append((request_id, f"{why}: {error_message(e)}"))
        return failed

    def with_rows(self, items: Sequence[RoutedDelta]) -> list[RoutedDelta]:
        """The pieces with their rows fetched into piece.tensors (a threaded host does this on
        the caller's thread, so the loop never waits on a fetch); a piece whose fetch fails is
        left as it is, and fails its request when `extend` tries again."""
        out = []
        for item in items:
            if item.rows is not None:
                try:
                    tensors = self.rows(item.request_id, item.rows)
                    piece = dataclasses.replace(item.piece, tensors=tensors)
                    item = dataclasses.replace(item, piece=piece, rows=None)
                except Exception as e:
                    if fatal_device_error(e) is not None:
                        raise
            out.append(item)
        return out

    def rows(self, request_id: str, rows: DeferredRows) -> dict[str, torch.Tensor]:
        """The request's rows behind `rows`, fetched here from their producer: each part's rows
        of this request, then the finished result's from row `skip` on, joined per name."""
        payloads = [*rows.parts, *([rows.finished] if rows.finished is not None else [])]
        values = self._resolve(payloads) if payloads else []
        pieces: dict[str, list[torch.Tensor]] = {}
        for part in values[: len(rows.parts)]:
            for name, value in part[request_id].items():
                pieces.setdefault(name, []).append(value)
        if rows.finished is not None:
            for name, value in values[-1].tensors.items():
                pieces.setdefault(name, []).append(value[rows.skip :])
        return {name: torch.cat(values) for name, values in pieces.items()}

    def end(self, request_id: str) -> None:
        """The request finished, failed or was aborted: its pieces stop (late ones are dropped)."""
        self._offsets.pop(request_id, None)
        self._pieces.end(request_id)
