"""Load, validate and identify user images and audio (torch-free: PIL, numpy, stdlib).

Every loader returns the item exactly as the encoders will see it (RGB image; mono float32
waveform at 16 kHz) and raises ValueError with a short reason; the caller prefixes the item's
name ("prompt 'req-3': images[1]: ..."). Identifiers are content hashes of that converted form,
so the same picture given as a path, bytes or a PIL image shares one identifier, while different
pixels, sizes or sample rates never do.
"""

from __future__ import annotations

import hashlib
import io
import os
import struct
import wave

import numpy as np
from PIL import Image

SAMPLE_RATE = 16000
# Modes PIL converts to RGB meaningfully. Integer/float modes ("I", "F", "I;16") have no agreed
# mapping to 0..255 colour, so they are rejected instead of silently clipped.
_CONVERTIBLE_MODES = {
    "1",
    "L",
    "LA",
    "La",
    "P",
    "PA",
    "RGB",
    "RGBA",
    "RGBa",
    "RGBX",
    "CMYK",
    "YCbCr",
}
# The Qwen2-VL resize refuses images more elongated than this; say so before any work.
MAX_ASPECT_RATIO = 200
_ID_VERSION = b"omni-mm-v1\0"


def load_image(item: object, max_pixels: int) -> Image.Image:
    """An RGB PIL image from a path, encoded bytes or a PIL image; decoded fully (so truncated
    files fail here) and checked for size before decoding (so huge files cost nothing)."""
    if isinstance(item, str | os.PathLike):
        try:
            image = Image.open(item)
        except FileNotFoundError:
            raise ValueError(f"no such image file {os.fspath(item)!r}") from None
        except (OSError, Image.DecompressionBombError) as e:
            raise ValueError(f"cannot read image file {os.fspath(item)!r}: {e}") from None
    elif isinstance(item, bytes | bytearray | memoryview):
        if not len(item):
            raise ValueError("image bytes are empty")
        try:
            image = Image.open(io.BytesIO(bytes(item)))
        except (OSError, Image.DecompressionBombError) as e:
            raise ValueError(f"cannot decode image bytes: {e}") from None
    elif isinstance(item, Image.Image):
        image = item
    else:
        raise ValueError(
            f"expected an image path, encoded bytes or PIL.Image, got {type(item).__name__}"
        )
    width, height = image.size
    if width < 1 or height < 1:
        raise ValueError(f"image has zero size {width}x{height}")
    if width * height > max_pixels:
        raise ValueError(f"image of {width}x{height} pixels exceeds max_pixels={max_pixels}")
    if max(width, height) > MAX_ASPECT_RATIO * min(width, height):
        raise ValueError(f"image of {width}x{height} is more elongated than {MAX_ASPECT_RATIO}:1")
    if image.mode not in _CONVERTIBLE_MODES:
        raise ValueError(f"image mode {image.mode!r} is not supported (convert it to RGB first)")
    try:
        image.load()
    except (OSError, ValueError, SyntaxError) as e:  # PIL reports truncation and bad data so
        raise ValueError(f"cannot decode image: {e}") from None
    return to_rgb(image)


def to_rgb(image: Image.Image) -> Image.Image:
    """RGB the way transformers' ``convert_to_rgb`` does it: anything else goes through RGBA
    composited over white, so transparent pixels become white rather than their hidden colour
    (same pixels as the HF processor would feed, hence the same identifier for both)."""
    if image.mode == "RGB":
        return image
    rgba = image.convert("RGBA")
    background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
    rgb = Image.alpha_composite(background, rgba).convert("RGB")
    if rgb.mode != "RGB" or len(rgb.getbands()) != 3:
        raise ValueError(f"image mode {image.mode!r} did not convert to RGB")
    return rgb


def image_identifier(image: Image.Image) -> str:
    """Content hash over mode, size and pixel bytes of an RGB image."""
    digest = hashlib.sha256(_ID_VERSION + b"image\0RGB\0")
    digest.update(struct.pack("<II", *image.size))
    digest.update(image.tobytes())
    return "image:" + digest.hexdigest()


def load_audio(item: object, max_seconds: float) -> np.ndarray:
    """A mono float32 waveform at 16 kHz from a WAV path, WAV bytes or (waveform, sample_rate);
    sample_rate in Hz, an integer or an integral float (16000.0).

    Other sample rates are resampled by linear interpolation (numpy only): good enough for
    speech into a 16 kHz mel front end; resample with a proper filter beforehand for music.
    """
    if isinstance(item, str | os.PathLike | bytes | bytearray | memoryview):
        waveform, rate = _read_wav(item)
    elif isinstance(item, tuple) and len(item) == 2:
        waveform, rate = item
        # An integral float (16000.0, e.g. from soundfile or a division) is that integer.
        integral = isinstance(rate, int | np.integer) or (
            isinstance(rate, float | np.floating) and float(rate).is_integer()
        )
        if isinstance(rate, bool) or not integral:
            raise ValueError(f"sample rate must be an integer, got {rate!r}")
        try:
            waveform = np.asarray(waveform, dtype=np.float64)
        except (TypeError, ValueError):
            raise ValueError("waveform is not a numeric array") from None
        if waveform.ndim != 1:
            raise ValueError(f"waveform must be 1-D (mono), got shape {waveform.shape}")
    else:
        raise ValueError(
            "expected a WAV path, WAV bytes or a (waveform, sample_rate) tuple, "
            f"got {type(item).__name__}"
        )
    rate = int(rate)
    if rate < 1000:
        raise ValueError(f"sample rate {rate} Hz is too low")
    if waveform.size == 0:
        raise ValueError("audio is empty")
    if not np.all(np.isfinite(waveform)):
        raise ValueError("waveform contains NaN or infinite samples")
    if waveform.size > max_seconds * rate:
        raise ValueError(f"audio of {waveform.size / rate:.2f} s is longer than {max_seconds} s")
    if rate != SAMPLE_RATE:
        num_out = max(1, round(waveform.size * SAMPLE_RATE / rate))
        times = np.arange(num_out) * (rate / SAMPLE_RATE)
        waveform = np.interp(times, np.arange(waveform.size), waveform)
    return np.ascontiguousarray(waveform, dtype=np.float32)


def audio_identifier(waveform: np.ndarray) -> str:
    """Content hash over sample rate, length and float32 samples of a 16 kHz mono waveform."""
    digest = hashlib.sha256(_ID_VERSION + b"audio\0")
    digest.update(struct.pack("<IQ", SAMPLE_RATE, waveform.size))
    digest.update(np.ascontiguousarray(waveform, dtype="<f4").tobytes())
    return "audio:" + digest.hexdigest()


def _read_wav(
    source: str | os.PathLike[str] | bytes | bytearray | memoryview,
) -> tuple[np.ndarray, int]:
    """PCM WAV (8/16/24/32-bit integer, any channel count, averaged to mono) via stdlib wave."""
    name = repr(os.fspath(source)) if isinstance(source, str | os.PathLike) else "bytes"
    target = os.fspath(source) if isinstance(source, str | os.PathLike) else io.BytesIO(source)
    try:
        with wave.open(target, "rb") as handle:
            channels, width = handle.getnchannels(), handle.getsampwidth()
            rate, num_frames = handle.getframerate(), handle.getnframes()
            data = handle.readframes(num_frames)
    except FileNotFoundError:
        raise ValueError(f"no such audio file {name}") from None
    except (wave.Error, EOFError, OSError) as e:
        raise ValueError(f"cannot read WAV {name}: {e or 'bad header'}") from None
    if len(data) < num_frames * channels * width:
        raise ValueError(
            f"WAV {name} is truncated: header says {num_frames} frames, "
            f"data holds {len(data) // max(channels * width, 1)}"
        )
    if width == 1:  # 8-bit WAV is unsigned
        samples = (np.frombuffer(data, np.uint8).astype(np.float64) - 128.0) / 128.0
    elif width == 2:
        samples = np.frombuffer(data, "<i2") / 32768.0
    elif width == 3:  # little-endian 24-bit: place in the top bytes of an int32
        raw = np.frombuffer(data, np.uint8).reshape(-1, 3).astype(np.int32)
        samples = ((raw[:, 0] << 8) | (raw[:, 1] << 16) | (raw[:, 2] << 24)) / 2.0**31
    elif width == 4:
        samples = np.frombuffer(data, "<i4") / 2.0**31
    else:
        raise ValueError(f"WAV {name}: unsupported sample width of {width} bytes")
    samples = samples.reshape(-1, channels).mean(axis=1)
    return samples, rate
