"""The timestamped transcription formats, from the speech segments (speech_segments.py) and the
text stage's result for each: verbose_json (OpenAI's TranscriptionVerbose / TranslationVerbose),
srt and vtt.

A segment's fields as OpenAI's: `id`, `seek` (its start in 10 ms frames), `start` and `end`
(seconds in the file), `text`, `tokens` (the text stage's token ids), `temperature`,
`avg_logprob` (the mean log-probability of its tokens), `compression_ratio` (the text's bytes
over their zlib-compressed bytes, as Whisper computes it) and `no_speech_prob` (1 - the VAD's
mean speech probability over it: omni's models have no no-speech token). `language` is the
request's by name ("fr": "french", as Whisper's), "english" for translations, or "unknown":
nothing detects it.
"""

from __future__ import annotations

import zlib
from typing import Any

from omni.entrypoints.openai.speech_segments import Segment
from omni.messages import StageResult


def segment_entries(
    segments: list[Segment], results: list[StageResult], temperature: float
) -> list[dict[str, Any]]:
    """Each segment with its transcript, in OpenAI's verbose_json form (segments whose text is
    empty are left out, and the ids count the others)."""
    entries: list[dict[str, Any]] = []
    for segment, result in zip(segments, results, strict=True):
        text = (result.text or "").strip()
        if not text:
            continue
        logprobs = [entry.logprob for entry in result.logprobs or []]
        encoded = text.encode()
        entries.append({
            "id": len(entries), "seek": round(segment.start_s * 100),
            "start": round(segment.start_s, 3), "end": round(segment.end_s, 3), "text": text,
            "tokens": list(result.token_ids), "temperature": temperature,
            "avg_logprob": sum(logprobs) / len(logprobs) if logprobs else 0.0,
            "compression_ratio": len(encoded) / len(zlib.compress(encoded)),
            "no_speech_prob": round(segment.no_speech_prob, 4),
        })  # fmt: skip
    return entries


def verbose_json(
    task: str, language: str, duration: float, text: str, entries: list[dict[str, Any]]
) -> dict[str, Any]:
    """The verbose_json body (its usage, the audio's duration, added by the caller)."""
    return {"task": task, "language": language, "duration": round(duration, 3), "text": text,
            "segments": entries}  # fmt: skip


def srt(entries: list[dict[str, Any]]) -> str:
    """SubRip: numbered cues from 1, times as HH:MM:SS,mmm."""
    return "".join(
        f"{n}\n{_clock(e['start'], ',')} --> {_clock(e['end'], ',')}\n{e['text']}\n\n"
        for n, e in enumerate(entries, start=1)
    )


def vtt(entries: list[dict[str, Any]]) -> str:
    """WebVTT: the header, then cues with times as HH:MM:SS.mmm."""
    cues = "".join(
        f"{_clock(e['start'], '.')} --> {_clock(e['end'], '.')}\n{e['text']}\n\n" for e in entries
    )
    return "WEBVTT\n\n" + cues


def _clock(seconds: float, separator: str) -> str:
    milliseconds = round(seconds * 1000)
    hours, rest = divmod(milliseconds, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    secs, millis = divmod(rest, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{separator}{millis:03d}"
