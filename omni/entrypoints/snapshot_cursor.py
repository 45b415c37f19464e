"""SnapshotCursor: what each snapshot of one request adds, for a consumer that sends pieces.

A request's snapshots (OmniOutput) are cumulative: every running stage's text so far, an audio
stage's waveform so far, and in the finished one every stage's whole result. `Omni.stream` (audio
pieces as partial results), the chat and completions SSE streams (text and pcm16 deltas) and the
speech stream (pcm bytes) send only what is new since their last piece; this cursor is where that
is computed, once, for all of them. One cursor per request and consumer, fed its snapshots in
order; a skipped snapshot (a request's channel keeps only the newest: request_stream.py) only
makes the next piece longer: nothing is lost or sent twice.

- Text: the text stage's text as a client sees it (`text`: a stop string the stage stopped on is
  cut off its end). The driver decodes it incrementally once per step for every listener
  (omni/driver/incremental_text.py), so the cursor never decodes: it returns the part after what
  it returned before. Streamed text only grows; only a finished stage's text is a full decode,
  which could differ from the streamed one in whitespace cleanup: then nothing more is returned
  (the client has the streamed text) and a warning is logged.
- Audio: per stage whose result carries audio and no error, the samples after those returned
  before. The finished result's audio is the whole waveform, so after streamed chunks its tail is
  the last piece, and a waveform that comes only whole (the whole-sequence path) is one piece.
  Pieces are 1-D copies: a view would keep each snapshot's whole waveform alive for as long as a
  caller keeps the piece.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from omni.messages import OmniOutput

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SnapshotNews:
    """What one snapshot added since the cursor's previous one."""

    text: str
    """The text stage's visible text not returned before ("" when none, or no text stage)."""
    audio: dict[str, torch.Tensor]
    """Stage -> its samples not returned before, a 1-D copy (only stages with new samples)."""


class SnapshotCursor:
    def __init__(
        self, text_stage: str | None = None, stop_strings: Mapping[int, str] | None = None
    ) -> None:
        """text_stage: the stage whose text is followed (None: none); stop_strings: stop token
        id -> the string it stands for, cut off the end of a text that stopped on it."""
        self.text_stage = text_stage
        self.stop_strings = dict(stop_strings or {})
        self.text_sent = ""
        """The visible text returned so far."""
        self.num_samples_sent: dict[str, int] = {}
        """Stage -> samples of its waveform returned so far."""

    def advance(self, out: OmniOutput) -> SnapshotNews:
        """What `out`, the request's next snapshot, adds to what this cursor returned before."""
        return SnapshotNews(self._new_text(out), self._new_audio(out))

    def text(self, out: OmniOutput) -> str:
        """The text stage's whole visible text in `out` (stop string removed); "" without it."""
        result = out.stages.get(self.text_stage) if self.text_stage is not None else None
        if result is None:
            return ""
        text = result.text or ""
        if result.finish_reason == "stopped" and result.token_ids:
            stop = self.stop_strings.get(result.token_ids[-1])
            if stop and text.endswith(stop):
                text = text[: -len(stop)]
        return text

    def _new_text(self, out: OmniOutput) -> str:
        text = self.text(out)
        if not text.startswith(self.text_sent):
            # Only if a final full decode differs from the streamed one (whitespace cleanup).
            log.warning("streamed text diverged from the final text; the rest is not sent")
            return ""
        new, self.text_sent = text[len(self.text_sent) :], text
        return new

    def _new_audio(self, out: OmniOutput) -> dict[str, torch.Tensor]:
        new = {}
        for stage, result in out.stages.items():
            if result.audio is None or not result.ok:
                continue
            sent = self.num_samples_sent.get(stage, 0)
            if result.audio.numel() > sent:
                new[stage] = result.audio.reshape(-1)[sent:].clone()
                self.num_samples_sent[stage] = result.audio.numel()
        return new
