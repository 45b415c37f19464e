"""Audio files into prompts (media_parts.as_wav / load_audio): a WAV as it is; MP3, FLAC and Ogg
decoded into a 16-bit mono WAV whose samples match the file's (within the codec's loss); any
other bytes a MediaError naming the field."""

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
    # Codecs may pad the start: compare the middle at the best shift.
    error = min(
        float(np.abs(samples[2000 + shift : 10000 + shift] - TONE[2000:10000]).max())
        for shift in range(-2000, 2000)
        if 10000 + shift <= len(samples)
    )
    assert error < tolerance, error


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
