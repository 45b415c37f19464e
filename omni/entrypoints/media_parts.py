"""Image and audio content parts of chat messages -> the bytes a prompt processor takes, under a
media policy: data: URLs always; local files only under `allowed_local_media_path` (the server's
--allowed-local-media-path; Omni.chat allows any); http(s) URLs only with `allow_remote_media`
(fetched with a timeout and a size limit). Every failure is a MediaError that names the part
(`param`) and what was wrong with it (the server answers it with a 400). Bytes are checked here
(the image opens, the WAV parses) so that an unreadable item is reported against its field.
Audio reaches the prompt processors as WAV: MP3, FLAC and Ogg are decoded into 16-bit mono WAV
here (`as_wav`, with soundfile's libsndfile), and M4A / MP4 (AAC) and WebM (Opus) with PyAV's
FFmpeg, the other file formats OpenAI's transcription endpoint takes."""

from __future__ import annotations

import base64
import binascii
import io
import os
import urllib.parse
import urllib.request
import wave
from dataclasses import dataclass
from typing import Any

AUDIO_FORMATS = ("wav", "mp3")  # chat's input_audio formats, as OpenAI's


@dataclass(frozen=True)
class MediaPolicy:
    """Where media parts may come from besides data: URLs."""

    allowed_local_media_path: str | None = None
    """Image/audio URLs may name local files under this directory (file:// or a plain path)."""
    allow_remote_media: bool = False
    """Fetch http(s) media URLs (timeout and size limit below); rejected otherwise."""
    media_timeout_s: float = 10.0
    """Seconds to fetch one remote item."""
    max_media_bytes: int = 20 * 1024 * 1024
    """The largest local or remote item."""


class MediaError(ValueError):
    """A bad media part: the message, the parameter it names and a short code."""

    def __init__(self, message: str, param: str, code: str = "invalid_value") -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


def bad_request(message: str, param: str, code: str = "invalid_value") -> MediaError:
    return MediaError(message, param, code)


def decode_base64(data: str, param: str) -> bytes:
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        shown = data if len(data) <= 40 else data[:40] + "..."
        raise bad_request(f"{param} is not valid base64: {shown!r}", param) from None
    if not raw:
        raise bad_request(f"{param} is empty", param)
    return raw


def load_image(url: str, param: str, policy: MediaPolicy) -> bytes:
    """An image_url's bytes (checked to open as an image)."""
    data = _fetch(url, param, policy)
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as image:
            image.verify()
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as e:
        raise bad_request(
            f"{param}: not a readable image ({type(e).__name__}: {e})", param
        ) from None
    return data


def load_audio(data: str, fmt: str, param: str) -> bytes:
    """input_audio {data: base64, format} -> WAV bytes (a WAV checked to parse, an MP3 decoded)."""
    if fmt not in AUDIO_FORMATS:
        raise bad_request(
            f"{param}.format {fmt!r} is not supported; supported: {list(AUDIO_FORMATS)}",
            f"{param}.format",
        )
    raw = decode_base64(data, f"{param}.data")
    if fmt == "wav":
        check_wav(raw, f"{param}.data")
        return raw
    return as_wav(raw, f"{param}.data")


READABLE = "WAV, MP3, FLAC, Ogg, M4A/MP4 or WebM"


def as_wav(raw: bytes, param: str) -> bytes:
    """An audio file as WAV bytes: a WAV as it is (checked), else MP3, FLAC, Ogg (Vorbis,
    Opus), M4A / MP4 or WebM decoded into a 16-bit mono WAV at its own rate; a MediaError
    naming `param` for any other bytes."""
    if raw[:4] == b"RIFF":
        check_wav(raw, param)
        return raw
    container = raw[4:8] == b"ftyp" or raw[:4] == b"\x1a\x45\xdf\xa3"  # MP4 family, Matroska
    try:
        samples, rate = _container_audio(raw) if container else _sndfile_audio(raw)
    except Exception as e:  # noqa: BLE001 - libsndfile's and FFmpeg's errors vary by format
        reason = str(e).rsplit(": ", 1)[-1]  # past "Error opening <the buffer's repr>"
        raise bad_request(
            f"{param}: not a readable audio file ({READABLE}): {reason}", param
        ) from None
    if samples.shape[0] == 0:
        raise bad_request(f"{param}: the audio has no samples", param)
    mono = (samples.mean(axis=1).clip(-1.0, 1.0) * 32767).round().astype("<i2")
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(int(rate))
        w.writeframes(mono.tobytes())
    return buffer.getvalue()


def _sndfile_audio(raw: bytes) -> tuple[Any, int]:
    """(samples [frames, channels] float32, rate) of an MP3, FLAC or Ogg file."""
    import soundfile

    samples, rate = soundfile.read(io.BytesIO(raw), dtype="float32", always_2d=True)
    return samples, int(rate)


def _container_audio(raw: bytes) -> tuple[Any, int]:
    """(samples [frames, channels] float32, rate) of the first audio stream of an MP4-family
    (M4A, MP4) or Matroska (WebM) file, decoded by FFmpeg."""
    import av
    import numpy as np

    with av.open(io.BytesIO(raw), mode="r") as container:
        if not container.streams.audio:
            raise ValueError("the file has no audio stream")
        stream = container.streams.audio[0]
        rate = stream.codec_context.sample_rate
        # Every frame as interleaved float32 at the stream's own rate and layout.
        resampler = av.AudioResampler(format="flt", layout=stream.codec_context.layout, rate=rate)
        pieces = []
        for frame in container.decode(stream):
            for out in resampler.resample(frame):
                pieces.append(out.to_ndarray().reshape(-1, out.layout.nb_channels))
        for out in resampler.resample(None):  # what the resampler still holds
            pieces.append(out.to_ndarray().reshape(-1, out.layout.nb_channels))
    channels = stream.codec_context.channels or 1
    samples = np.concatenate(pieces) if pieces else np.zeros((0, channels), np.float32)
    return samples, int(rate)


def check_wav(raw: bytes, param: str) -> None:
    """A MediaError naming `param` unless `raw` is a WAV file with samples."""
    try:
        with wave.open(io.BytesIO(raw)) as w:
            if w.getnframes() == 0:
                raise bad_request(f"{param}: the WAV has no samples", param)
    except (wave.Error, EOFError) as e:
        raise bad_request(f"{param}: not a readable WAV ({e})", param) from None


def _fetch(url: str, param: str, policy: MediaPolicy) -> bytes:
    if url.startswith("data:"):
        header, sep, payload = url.partition(",")
        if not sep or ";base64" not in header:
            raise bad_request(
                f"{param}: a data: URL must be data:<mime>;base64,<data>, got {url[:40]!r}", param
            )
        return decode_base64(payload, param)
    scheme = urllib.parse.urlsplit(url).scheme.lower()
    if scheme in ("http", "https"):
        if not policy.allow_remote_media:
            raise bad_request(
                f"{param}: remote media URLs are not allowed ({url[:80]!r}); start the server "
                "with --allow-remote-media, or send a data: URL",
                param,
                "remote_media_disabled",
            )
        return _download(url, param, policy)
    if scheme in ("", "file"):
        return _read_local(url, param, policy)
    raise bad_request(f"{param}: unsupported URL scheme {scheme!r}", param)


def _read_local(url: str, param: str, policy: MediaPolicy) -> bytes:
    root = policy.allowed_local_media_path
    if root is None:
        raise bad_request(
            f"{param}: local files are not allowed ({url[:80]!r}); start the server with "
            "--allowed-local-media-path DIR",
            param,
            "local_media_disabled",
        )
    path = urllib.parse.unquote(urllib.parse.urlsplit(url).path) if url.startswith("file:") else url
    real, base = os.path.realpath(path), os.path.realpath(root)
    if os.path.commonpath([real, base]) != base:
        raise bad_request(f"{param}: {path!r} is outside the allowed media directory", param)
    if not os.path.isfile(real):
        raise bad_request(f"{param}: no such file {path!r}", param)
    if os.path.getsize(real) > policy.max_media_bytes:
        raise bad_request(f"{param}: {path!r} is over {policy.max_media_bytes} bytes", param)
    with open(real, "rb") as f:
        return f.read()


def _download(url: str, param: str, policy: MediaPolicy) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=policy.media_timeout_s) as response:  # noqa: S310
            data = response.read(policy.max_media_bytes + 1)
    except (OSError, ValueError) as e:
        raise bad_request(f"{param}: could not fetch {url[:80]!r}: {e}", param) from None
    if len(data) > policy.max_media_bytes:
        raise bad_request(f"{param}: {url[:80]!r} is over {policy.max_media_bytes} bytes", param)
    return data
