"""Audio files into prompts (media_parts.as_wav / load_audio): a WAV as it is; MP3, FLAC, Ogg,
M4A / MP4 (AAC) and WebM (Opus) decoded into a 16-bit mono WAV whose samples match the file's
(within the codec's loss); any other bytes a MediaError naming the field. The M4A, MP4 and WebM
files are encoded here by PyAV's FFmpeg, as a phone or a browser records them."""

from __future__ import annotations

import base64
import io
import wave

import numpy as np
import pytest
import soundfile

from omni.entrypoints.media_parts import MediaError, as_wav, load_audio

RATE = 16000
TONE = (np.sin(np.arange(RATE) * 2 * np.pi * 440 / RATE) * 0.5).astype(np.float32)


def encoded(samples: np.ndarray, fmt: str, **kwargs) -> bytes:
    buffer = io.BytesIO()
    soundfile.write(buffer, samples, RATE, format=fmt, **kwargs)
    return buffer.getvalue()


def recorded(samples: np.ndarray, container: str, codec: str) -> bytes:
    """`samples` [frames, channels] at RATE in an FFmpeg container (ipod: .m4a, mp4, webm).
    PyAV is a dependency of omni; the GPU machine's wheels leave it out (their size limit)."""
    av = pytest.importorskip("av")
    layout = "mono" if samples.shape[1] == 1 else "stereo"
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format=container) as out:
        stream = out.add_stream(codec, rate=48000 if codec == "libopus" else RATE)
        stream.layout = layout
        for start in range(0, len(samples), 1024):
            planar = np.ascontiguousarray(samples[start : start + 1024].T)
            frame = av.AudioFrame.from_ndarray(planar, format="fltp", layout=layout)
            frame.sample_rate = RATE
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return buffer.getvalue()


def best_shift_error(samples: np.ndarray, reference: np.ndarray) -> float:
    """The largest difference over the middle of `reference` at the best alignment (codecs pad
    the start)."""
    return min(
        float(np.abs(samples[2000 + shift : 10000 + shift] - reference[2000:10000]).max())
        for shift in range(-2000, 2000)
        if 10000 + shift <= len(samples)
    )


def wav_samples(data: bytes) -> tuple[np.ndarray, int, int]:
    with wave.open(io.BytesIO(data)) as w:
        frames = np.frombuffer(w.readframes(w.getnframes()), "<i2")
        return frames.astype(np.float32) / 32767, w.getframerate(), w.getnchannels()


@pytest.mark.parametrize(
    ("fmt", "subtype", "tolerance"),
    [("FLAC", None, 1e-4), ("OGG", "VORBIS", 0.05), ("OGG", "OPUS", 0.1), ("MP3", None, 0.05)],
)
def test_compressed_audio_becomes_a_wav_of_the_same_sound(fmt, subtype, tolerance):
    data = encoded(TONE, fmt, subtype=subtype)
    samples, rate, channels = wav_samples(as_wav(data, "file"))
    assert (rate, channels) == (RATE, 1)
    error = best_shift_error(samples, TONE)
    assert error < tolerance, error


@pytest.mark.parametrize(
    ("container", "codec", "rate", "tolerance"),
    [("ipod", "aac", RATE, 0.05), ("mp4", "aac", RATE, 0.05), ("webm", "libopus", 48000, 0.1)],
)
def test_m4a_mp4_and_webm_become_a_wav_of_the_same_sound(container, codec, rate, tolerance):
    """The formats OpenAI's transcription endpoint takes beyond WAV, MP3, FLAC and Ogg; stereo
    averaged; Opus decodes at its own 48 kHz."""
    stereo = np.stack([TONE, TONE * 0.5], axis=1)  # no DC: Opus filters it out
    samples, got_rate, channels = wav_samples(as_wav(recorded(stereo, container, codec), "file"))
    assert (got_rate, channels) == (rate, 1)
    assert abs(len(samples) / rate - 1.0) < 0.1  # one second, give or take the codec's frames
    at_rate = np.sin(np.arange(rate) * 2 * np.pi * 440 / rate) * 0.5
    error = best_shift_error(samples, at_rate * 0.75)
    assert error < tolerance, error


def test_a_container_without_readable_audio_names_the_field():
    with pytest.raises(MediaError, match="M4A/MP4 or WebM") as info:
        as_wav(b"\x00\x00\x00\x1cftypM4A " + b"\x00" * 64, "file")
    assert info.value.param == "file"


def test_a_wav_is_kept_and_stereo_is_averaged():
    data = encoded(TONE, "WAV", subtype="PCM_16")
    assert as_wav(data, "file") == data
    stereo = encoded(np.stack([TONE, -TONE * 0 + 0.25], axis=1), "FLAC")
    samples, _, channels = wav_samples(as_wav(stereo, "file"))
    assert channels == 1 and np.allclose(samples, (TONE + 0.25) / 2, atol=1e-3)


def test_chat_input_audio_takes_mp3_as_openai_does():
    mp3 = base64.b64encode(encoded(TONE, "MP3")).decode()
    samples, rate, _ = wav_samples(load_audio(mp3, "mp3", "messages[0].content[0].input_audio"))
    assert rate == RATE and len(samples) >= RATE
    with pytest.raises(MediaError) as info:  # the format given is the one checked
        load_audio(mp3, "wav", "messages[0].content[0].input_audio")
    assert info.value.param == "messages[0].content[0].input_audio.data"
    with pytest.raises(MediaError, match="supported: \\['wav', 'mp3'\\]"):
        load_audio(mp3, "flac", "x")


@pytest.mark.parametrize("data", [b"ID3 not really", b"\x00" * 64, b"RIFF....WAVEfmt "])
def test_other_bytes_name_the_field(data):
    with pytest.raises(MediaError) as info:
        as_wav(data, "file")
    assert info.value.param == "file" and "file:" in info.value.message
