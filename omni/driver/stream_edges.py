"""StreamEdges: which edges of a streaming request start their consumer early, and what they send.

A request added with stream_audio=True runs every edge whose consumer has `stream.enabled` (and
an input processor that can stream: its family manifest's EdgeSpec.stream) as a stream: once the
upstream stage has reported `min_upstream_tokens` tokens, the consumer gets a RoutedInput with the
partial upstream result (input_complete=False), and every later upstream report becomes a
RoutedDelta piece, the last (finish_reason set) sent when the upstream finishes. Pieces carry the
upstream's new tokens and, when the edge needs rows (the upstream runs with step_rows), where its
new per-token output rows are (DeferredRows: the step-row payloads the upstream reported, the
last piece its finished result's payload): the consumer fetches them from the producer, the
driver never holds the rows themselves. A multi-code upstream's pieces carry each token's codes
(tensors["codes"], [tokens, 1 + residual codes], as its finished result). An edge that holds
tokens back (EdgeStreaming.held_back) sends a token only once that many more have come, or the
last piece without them. `offset` numbers the pieces so the consumer's host applies them in
order. Edges that do not stream route as before: once every input has finished.
"""

from __future__ import annotations

from typing import Any

import torch

from omni.config import OmniConfig, StageConfig
from omni.driver.request_state import RequestState
from omni.messages import DeferredRows, RoutedDelta, RoutedInput, StageResult, StageUpdate
from omni.registry import EdgeStreaming, get_edge_streaming

Routed = dict[str, list[RoutedInput | RoutedDelta]]


class StreamEdges:
    def __init__(self, config: OmniConfig) -> None:
        self.config = config
        # stage -> its streaming consumers and their edges
        self.edges: dict[str, list[tuple[StageConfig, EdgeStreaming]]] = {}
        for stage in config.stages:
            spec = get_edge_streaming(stage.input_processor)
            if stage.stream.enabled and spec is not None:
                self.edges.setdefault(stage.inputs[0], []).append((stage, spec))

    def needs_rows(self, stage: str, needed: set[str]) -> bool:
        """Whether a streaming request must report `stage`'s rows as it goes."""
        return any(c.name in needed and spec.needs_rows for c, spec in self.edges.get(stage, ()))

    def on_update(
        self, tracked: RequestState, update: StageUpdate, needed: set[str], routed: Routed
    ) -> None:
        """Start the consumers that now have enough input; send the others the new piece."""
        for consumer, spec in self.edges.get(update.stage, ()):
            name = consumer.name
            if name not in needed:
                continue
            sent = tracked.streamed.get(name)
            if sent is None:
                tokens = tracked.tokens.get(update.stage, [])
                if name in tracked.inflight or len(tokens) < spec.min_upstream_tokens:
                    continue
                partial, rows = self._piece(tracked, update.stage, name, spec, 0)
                routed.setdefault(name, []).append(
                    RoutedInput(
                        tracked.prompt.request_id,
                        {update.stage: partial},
                        tracked.routed_prompt(),
                        tracked.params[name],
                        input_complete=False,
                        step_rows=self.needs_rows(name, needed),
                        rows=rows,
                    )
                )
                tracked.start(name)
            elif name in tracked.inflight:
                piece, rows = self._piece(tracked, update.stage, name, spec, sent)
                if piece.token_ids:
                    routed.setdefault(name, []).append(
                        RoutedDelta(tracked.prompt.request_id, piece, sent, rows)
                    )

    def on_finished(
        self, tracked: RequestState, result: StageResult, payload: Any, routed: Routed
    ) -> None:
        """Send the last piece to the consumers streaming from `result.stage` (a light result:
        the rest of its rows go by its payload)."""
        for consumer, spec in self.edges.get(result.stage, ()):
            name = consumer.name
            sent = tracked.streamed.get(name)
            if sent is None or name not in tracked.inflight:
                continue
            piece, rows = self._piece(tracked, result.stage, name, spec, sent, (result, payload))
            request_id = tracked.prompt.request_id
            routed.setdefault(name, []).append(RoutedDelta(request_id, piece, sent, rows))

    def _piece(
        self,
        tracked: RequestState,
        stage: str,
        consumer: str,
        spec: EdgeStreaming,
        sent: int,
        finished: tuple[StageResult, Any] | None = None,
    ) -> tuple[StageResult, DeferredRows | None]:
        """The upstream's tokens the consumer has not had yet, and where their rows are (the
        step-row payloads not sent yet); the whole result so far when sent is 0. With
        `finished` (its light result and payload), the rest of that result, marked finished:
        its rows from the payload, after those already sent."""
        root = not self.config.stage(stage).inputs
        token_ids = tracked.tokens.get(stage, []) if finished is None else finished[0].token_ids
        # The first piece is a result for the input processor, which drops held-back tokens
        # itself; later pieces leave them out until more follow.
        end = len(token_ids) if sent == 0 else max(len(token_ids) - spec.held_back, sent)
        codes = tracked.codes.get(stage)
        tensors = {}
        if codes:
            width = 1 + len(codes[0])
            tensors["codes"] = torch.tensor(
                [(t, *c) for t, c in zip(token_ids[sent:end], codes[sent:end], strict=True)],
                dtype=torch.int64,
            ).reshape(end - sent, width)
        rows = None
        if spec.needs_rows:
            num_parts, num_rows = tracked.rows_streamed.get(consumer, (0, 0))
            if finished is not None:
                rows = DeferredRows(finished=finished[1], skip=num_rows)
            else:
                parts = tracked.rows.get(stage, [])[num_parts:]
                rows = DeferredRows(parts=tuple(payload for payload, _ in parts))
                num_rows += sum(n for _, n in parts)
                tracked.rows_streamed[consumer] = (num_parts + len(parts), num_rows)
        tracked.streamed[consumer] = max(len(token_ids) - spec.held_back, sent)
        piece = StageResult(
            request_id=tracked.prompt.request_id,
            stage=stage,
            # A root stage's prompt is the request's; a later stage's is not needed by any
            # streaming processor so far, and not known here.
            prompt_token_ids=list(tracked.prompt.prompt_token_ids) if sent == 0 and root else [],
            token_ids=list(token_ids[sent:end]),
            finish_reason=None if finished is None else (finished[0].finish_reason or "stopped"),
            tensors=tensors,
        )
        return piece, rows
