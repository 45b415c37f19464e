"""SnapshotCursor: what each cumulative snapshot of a request adds, as Omni.stream, the chat,
completions and speech streams send it: text deltas (stop string cut, a diverged final text not
resent) and audio pieces that join to exactly the finished waveform, whichever snapshots the
consumer skipped."""

from __future__ import annotations

import logging

import torch

from omni.entrypoints.snapshot_cursor import SnapshotCursor
from omni.messages import OmniOutput, StageResult

WAVE = torch.arange(1, 101, dtype=torch.float32) / 100  # 100 distinct samples


def _text(text: str, token_ids: list[int], finish: str | None = None) -> StageResult:
    return StageResult("r", "thinker", [1, 2], token_ids, finish_reason=finish, text=text)


def _audio(num_samples: int, finish: str | None = None, **kw: object) -> StageResult:
    audio = WAVE[:num_samples].clone()  # each snapshot holds its own copy of the waveform so far
    return StageResult(
        "r", "vocoder", [], [], finish_reason=finish, audio=audio, sample_rate=24000, **kw
    )


def _out(*results: StageResult, error: str | None = None) -> OmniOutput:
    finished = all(r.finished for r in results)
    stages = {r.stage: r for r in results}
    return OmniOutput("r", stages, results[-1], error=error, finished=finished)


def test_text_deltas_grow_and_a_skipped_snapshot_only_makes_the_next_one_longer():
    cursor = SnapshotCursor("thinker")
    texts = ["", "Hel", "Hello", "Hello, wor", "Hello, world"]
    got = [cursor.advance(_out(_text(t, list(range(i))))).text for i, t in enumerate(texts)]
    assert got == ["", "Hel", "lo", ", wor", "ld"]
    skipping = SnapshotCursor("thinker")
    got = [skipping.advance(_out(_text(texts[i], [0] * i))).text for i in (1, 4)]
    assert got == ["Hel", "lo, world"]
    assert skipping.text_sent == "Hello, world"


def test_without_the_text_stage_there_is_no_text():
    assert SnapshotCursor().advance(_out(_text("Hi", [5]))).text == ""
    cursor = SnapshotCursor("thinker")
    assert cursor.advance(_out(_audio(10))).text == "" and cursor.text(_out(_audio(10))) == ""


def test_the_stop_string_a_stage_stopped_on_is_cut():
    cursor = SnapshotCursor("thinker", {7: " END"})
    assert cursor.advance(_out(_text("Bye", [4]))).text == "Bye"
    final = _out(_text("Bye now END", [4, 5, 7], finish="stopped"))
    assert cursor.advance(final).text == " now" and cursor.text(final) == "Bye now"
    # Only a stop the stage stopped on, only at the end, only for "stopped".
    assert cursor.text(_out(_text("Bye END", [4, 7], finish="length"))) == "Bye END"
    assert cursor.text(_out(_text("Bye END", [4, 8], finish="stopped"))) == "Bye END"


def test_a_final_text_that_diverged_from_the_streamed_one_is_not_resent(caplog):
    cursor = SnapshotCursor("thinker")
    assert cursor.advance(_out(_text("a  b", [1, 2]))).text == "a  b"
    with caplog.at_level(logging.WARNING):
        assert cursor.advance(_out(_text("a b c", [1, 2, 3], finish="stopped"))).text == ""
    assert "diverged" in caplog.text
    assert cursor.text_sent == "a  b"  # what the client has


def test_audio_pieces_are_the_new_samples_and_the_finished_waveform_gives_its_tail():
    cursor = SnapshotCursor()
    snapshots = [_out(_audio(n)) for n in (0, 10, 10, 35, 80)]
    snapshots.append(_out(_audio(100, finish="stopped")))  # the whole waveform, after chunks
    pieces = [cursor.advance(s).audio.get("vocoder") for s in snapshots]
    assert pieces[0] is None and pieces[2] is None  # nothing new: no piece
    assert [p.numel() for p in pieces if p is not None] == [10, 25, 45, 20]
    assert torch.equal(torch.cat([p for p in pieces if p is not None]), WAVE)
    assert cursor.num_samples_sent == {"vocoder": 100}
    assert cursor.advance(snapshots[-1]).audio == {}  # the same snapshot again: nothing new


def test_skipped_snapshots_lose_nothing_and_a_whole_waveform_is_one_piece():
    cursor = SnapshotCursor()
    assert torch.equal(cursor.advance(_out(_audio(30))).audio["vocoder"], WAVE[:30])
    # Snapshots at 50 and 70 samples were skipped (the channel keeps only the newest).
    tail = cursor.advance(_out(_audio(100, finish="stopped"))).audio["vocoder"]
    assert torch.equal(tail, WAVE[30:])
    whole = SnapshotCursor().advance(_out(_audio(100, finish="stopped"))).audio["vocoder"]
    assert torch.equal(whole, WAVE)  # the whole-sequence path: its waveform comes only whole


def test_pieces_are_1d_copies_and_stages_are_followed_apart():
    cursor = SnapshotCursor()
    snapshot = _out(_audio(40))
    wide = StageResult(
        "r", "other", [], [], None, audio=WAVE[:20].reshape(1, 20), sample_rate=16000
    )
    news = cursor.advance(_out(snapshot.stages["vocoder"], wide))
    piece = news.audio["vocoder"]
    snapshot.stages["vocoder"].audio.zero_()  # the snapshot's waveform goes on changing
    assert torch.equal(piece, WAVE[:40]) and piece._base is None
    assert news.audio["other"].shape == (20,) and torch.equal(news.audio["other"], WAVE[:20])
    assert cursor.num_samples_sent == {"vocoder": 40, "other": 20}


def test_a_failed_result_gives_no_audio_but_its_text_still_counts():
    cursor = SnapshotCursor("thinker")
    failed = _audio(50, finish="error", error="stage 'vocoder' failed")
    news = cursor.advance(_out(_text("Hi", [3]), failed, error="stage 'vocoder' failed"))
    assert news.audio == {} and news.text == "Hi"
