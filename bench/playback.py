"""Playback: the silences a listener would hear in a streamed spoken answer.

A player starts at the first audio and plays each chunk as it comes. When a chunk arrives after
the audio before it has run out, the listener hears a gap (a stall) of the difference, and
playback resumes with that chunk. First audio measures how soon speech starts; the stalls
measure whether it then keeps up: a stream can start fast and still stutter when later chunks
queue behind other requests' work. Snapshots carry the audio so far (growing), so an arrival
is a snapshot whose audio is longer than the last one's."""

from __future__ import annotations

import numpy as np


class Playback:
    """One request's playback, fed every snapshot's audio length in order of arrival."""

    def __init__(self) -> None:
        self.num_samples = 0  # audio received so far
        self.runs_out_at: float | None = None  # when the audio received so far ends playing
        self.stall_s = 0.0  # silence heard after the first audio, in all
        self.num_stalls = 0

    def arrived(self, now: float, total_samples: int, sample_rate: int) -> None:
        """A snapshot at `now` (seconds, any clock) carrying `total_samples` of audio so far."""
        new = total_samples - self.num_samples
        if new <= 0 or sample_rate <= 0:
            return
        self.num_samples = total_samples
        seconds = new / sample_rate
        if self.runs_out_at is None or now > self.runs_out_at:
            if self.runs_out_at is not None:  # the audio ran out before this chunk came
                self.stall_s += now - self.runs_out_at
                self.num_stalls += 1
            self.runs_out_at = now + seconds
        else:
            self.runs_out_at += seconds


def gap_summary(rows: list[dict]) -> tuple[float, float, int] | None:
    """The level's gaps from its request rows' "stall_s": (p50 s, p99 s, requests with any);
    None for rows without it (transformers' whole answers)."""
    if not rows or "stall_s" not in rows[0]:
        return None
    stalls = [r["stall_s"] for r in rows]
    p50, p99 = (float(np.percentile(stalls, q)) for q in (50, 99))
    return p50, p99, sum(s > 0 for s in stalls)
