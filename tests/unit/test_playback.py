"""bench/playback.py: the gaps a listener hears in a streamed answer."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

# bench/ is scripts, not a package: load the one module by its path (sys.path left alone)
_spec = importlib.util.spec_from_file_location(
    "bench_playback", Path(__file__).resolve().parents[2] / "bench" / "playback.py"
)
assert _spec is not None and _spec.loader is not None
_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_module)
Playback = _module.Playback
gap_summary = _module.gap_summary


def test_chunks_ahead_of_playback_play_without_a_gap():
    play = Playback()
    play.arrived(1.0, 100, 100)  # 1 s of audio at t=1: plays until 2
    play.arrived(1.5, 250, 100)  # 1.5 s more before it ran out: until 3.5
    play.arrived(3.4, 300, 100)
    assert (play.stall_s, play.num_stalls) == (0.0, 0)
    assert play.runs_out_at == pytest.approx(4.0)


def test_a_late_chunk_is_a_gap_of_the_time_past_the_end():
    play = Playback()
    play.arrived(0.5, 20, 100)  # 0.2 s: runs out at 0.7
    play.arrived(1.0, 120, 100)  # 0.3 s of silence, then 1 s: until 2.0
    play.arrived(2.5, 220, 100)  # 0.5 s more silence
    assert play.num_stalls == 2
    assert play.stall_s == pytest.approx(0.8)
    assert play.runs_out_at == pytest.approx(3.5)


def test_snapshots_without_new_audio_change_nothing():
    play = Playback()
    play.arrived(0.0, 0, 100)  # no audio yet: playback has not started
    play.arrived(1.0, 50, 100)
    play.arrived(3.0, 50, 100)  # the same audio again (a text snapshot, the final result)
    assert (play.stall_s, play.num_stalls, play.runs_out_at) == (0.0, 0, 1.5)


def test_a_level_summary_counts_the_requests_that_heard_a_gap():
    rows = [{"stall_s": 0.0}, {"stall_s": 0.2}, {"stall_s": 0.0}, {"stall_s": 0.4}]
    p50, p99, heard = gap_summary(rows)
    assert (p50, heard) == (pytest.approx(0.1), 2) and p99 == pytest.approx(0.394)
    assert gap_summary([{"e2e": 1.0}]) is None  # transformers' rows: whole answers
