"""Qwen2.5-Omni prompt processing: item identifiers, placeholder expansion, bad-input errors."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from helpers import wav_bytes
from PIL import Image

from stages.qwen2_5_omni import media
from stages.qwen2_5_omni.encoder_cache import EncoderCache


@pytest.fixture(scope="module")
def omni_dir() -> str:
    from tools.make_tiny_checkpoint import ensure_checkpoint

    return str(ensure_checkpoint("qwen2_5_omni", "tiny", 0))


@pytest.fixture(scope="module")
def proc(omni_dir):
    from stages.qwen2_5_omni.prompt_processor import OmniPromptProcessor

    return OmniPromptProcessor(omni_dir, max_pixels=200 * 200)


def _image(seed: int, size=(40, 30)) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))


def _png(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def _tone(n: int = 8000) -> np.ndarray:
    return (np.sin(np.arange(n) / 7.0) * 12000).astype(np.int16)


# ---- identifiers ---------------------------------------------------------------------------------
def test_identifiers_differ_for_same_byte_length_and_for_reshaped_pixels():
    a, b = _image(0), _image(1)
    assert len(a.tobytes()) == len(b.tobytes())
    assert media.image_identifier(a) != media.image_identifier(b)
    pixels = np.asarray(a)  # 30 x 40 x 3; the same bytes as a 40 x 30 image
    c = Image.fromarray(pixels.reshape(40, 30, 3))
    assert c.tobytes() == a.tobytes() and c.size != a.size
    assert media.image_identifier(a) != media.image_identifier(c)
    wav = media.load_audio((np.zeros(1600), 16000), 30)
    assert media.audio_identifier(wav) != media.audio_identifier(np.zeros(1601, np.float32))


def test_same_image_as_path_bytes_pil_shares_identifier_and_pixels(proc, tmp_path):
    image = _image(2)
    path = tmp_path / "a.png"
    path.write_bytes(_png(image))
    forms = [str(path), path, _png(image), image, Image.open(path)]
    outs = [proc(f"r{i}", {"prompt": "hi", "images": [f]}) for i, f in enumerate(forms)]
    ids = {o.mm_inputs[0].identifier for o in outs}
    assert len(ids) == 1
    for o in outs[1:]:
        np.testing.assert_array_equal(
            o.extras["pixel_values"][0], outs[0].extras["pixel_values"][0]
        )
        assert o.prompt_token_ids == outs[0].prompt_token_ids
    # An RGBA image becomes RGB over white, exactly as transformers' convert_to_rgb does.
    rgba = image.convert("RGBA")
    assert proc("r", {"prompt": "x", "images": rgba}).mm_inputs[0].identifier in ids


def test_audio_forms_and_resampling(proc, tmp_path):
    tone = _tone()
    path = tmp_path / "a.wav"
    path.write_bytes(wav_bytes(tone))
    as_float = (tone / 32768.0, 16000)
    ids = {
        proc("r", {"prompt": "x", "audio": [a]}).mm_inputs[0].identifier
        for a in (str(path), wav_bytes(tone), as_float)
    }
    assert len(ids) == 1
    stereo = np.repeat(tone, 2)  # two equal channels average to the mono signal
    assert (
        proc("r", {"prompt": "x", "audio": wav_bytes(stereo, channels=2)}).mm_inputs[0].identifier
        in ids
    )
    resampled = media.load_audio((np.zeros(8000), 8000), 30)
    assert resampled.shape == (16000,) and resampled.dtype == np.float32


def test_integral_float_sample_rate_is_accepted(proc):
    """(waveform, 16000.0), e.g. a rate computed by a division, is the same audio as 16000."""
    samples = _tone() / 32768.0
    expected = proc("r", {"prompt": "x", "audio": [(samples, 16000)]})
    for rate in (16000.0, np.float64(16000.0), np.float32(16000.0)):
        got = proc("r", {"prompt": "x", "audio": [(samples, rate)]})
        assert got.mm_inputs[0].identifier == expected.mm_inputs[0].identifier, rate
        assert got.prompt_token_ids == expected.prompt_token_ids
    # One bare pair (no list around it), as a caller would write `audio=(waveform, rate)`.
    for rate in (16000, 16000.0, np.float32(16000.0)):
        got = proc("r", {"prompt": "x", "audio": (samples, rate)})
        assert got.mm_inputs[0].identifier == expected.mm_inputs[0].identifier, rate
        assert got.prompt_token_ids == expected.prompt_token_ids
    for rate, why in ((16000.5, "integer, got 16000.5"), ("16000", "integer, got '16000'")):
        with pytest.raises(
            ValueError, match=rf"prompt 'r': audio\[0\]: sample rate must be an {why}"
        ):
            proc("r", {"prompt": "x", "audio": (samples, rate)})
    # Two audios in a tuple are still two items.
    two = proc("r", {"prompt": "x", "audio": ((samples, 16000), (samples, 16000.0))})
    assert [m.identifier for m in two.mm_inputs] == [expected.mm_inputs[0].identifier] * 2
    # Resampled the same way as the integer rate.
    as_float = media.load_audio((np.zeros(8000), 8000.0), 30)
    assert np.array_equal(as_float, media.load_audio((np.zeros(8000), 8000), 30))


# ---- placement -----------------------------------------------------------------------------------
def test_chat_turn_frames_items_and_ranges(proc):
    out = proc(
        "r", {"prompt": "what?", "images": [_image(0)], "audio": [(_tone() / 32768.0, 16000)]}
    )
    tok = proc.tokenizer
    ids = out.prompt_token_ids
    image, audio = out.mm_inputs
    assert ids[image.offset - 1] == tok.convert_tokens_to_ids("<|vision_bos|>")
    assert ids[image.offset + image.length] == tok.convert_tokens_to_ids("<|vision_eos|>")
    assert ids[audio.offset - 1] == tok.convert_tokens_to_ids("<|audio_bos|>")
    assert set(ids[audio.offset : audio.offset + audio.length]) == {proc.placeholder["audio"]}
    assert tok.decode(ids).endswith("what?<|im_end|>\n<|im_start|>assistant\n")
    assert out.extras["mm_identifiers"] == [image.identifier, audio.identifier]
    grid = out.extras["image_grid_thw"][0]
    assert image.length == int(np.prod(grid)) // 4
    assert out.extras["input_features"][0].shape[1] == out.extras["audio_feature_lengths"][0]


def test_explicit_placeholders_framed_and_pre_expanded_ids_kept(proc):
    img = _image(3)
    out = proc("r", {"prompt": "look <|IMAGE|> now", "images": [img]})
    again = proc("r", {"prompt_token_ids": out.prompt_token_ids, "images": [img]})
    assert again.prompt_token_ids == out.prompt_token_ids and again.mm_inputs == out.mm_inputs
    framed = "look <|vision_bos|><|IMAGE|><|vision_eos|> now"
    assert proc("r", {"prompt": framed, "images": [img]}).prompt_token_ids == out.prompt_token_ids
    plain = proc("r", "just text")
    assert plain.extras == {} and plain.mm_inputs == ()


def test_prompt_processor_registry():
    from omni.entrypoints.prompt_processor import PromptProcessor
    from omni.registry import get_prompt_processor
    from stages.qwen2_5_omni.prompt_processor import OmniPromptProcessor

    assert get_prompt_processor("qwen2_5_omni_thinker") is OmniPromptProcessor
    assert get_prompt_processor("causal_lm") is PromptProcessor
    assert get_prompt_processor("some_other_adapter") is PromptProcessor


# ---- bad input -----------------------------------------------------------------------------------
def _bad_cases(tmp_path):
    good = _image(0)
    png = _png(good)
    garbage = tmp_path / "garbage.png"
    garbage.write_bytes(b"not an image at all" * 10)
    truncated = tmp_path / "truncated.png"
    truncated.write_bytes(png[: len(png) // 2])
    trunc_wav = tmp_path / "truncated.wav"
    trunc_wav.write_bytes(wav_bytes(_tone())[:-4000])
    float_image = Image.fromarray(np.zeros((20, 20), np.float32), mode="F")
    tone = (_tone() / 32768.0, 16000)
    return [
        ({"images": [good, str(garbage)]}, "images[1]", "cannot read image"),
        ({"images": [good, str(truncated)]}, "images[1]", "decode"),
        ({"images": [good, str(tmp_path / "missing.png")]}, "images[1]", "no such image"),
        ({"images": [good, b""]}, "images[1]", "empty"),
        ({"images": [good, Image.new("RGB", (0, 5))]}, "images[1]", "zero size"),
        ({"images": [good, _image(1, (300, 300))]}, "images[1]", "max_pixels"),
        ({"images": [good, float_image]}, "images[1]", "mode 'F'"),
        ({"images": [good, _image(1, (201, 1))]}, "images[1]", "elongated"),
        ({"images": [good, 42]}, "images[1]", "expected an image"),
        ({"audio": [tone, (np.zeros(0), 16000)]}, "audio[1]", "empty"),
        ({"audio": [tone, (np.zeros(100), 0)]}, "audio[1]", "too low"),
        ({"audio": [tone, (np.zeros(100), 16000.5)]}, "audio[1]", "integer, got 16000.5"),
        ({"audio": [tone, (np.zeros(100), float("nan"))]}, "audio[1]", "integer, got nan"),
        ({"audio": [tone, (np.zeros(100), "16000")]}, "audio[1]", "integer, got '16000'"),
        ({"audio": [tone, (np.zeros(100), True)]}, "audio[1]", "integer, got True"),
        ({"audio": [tone, (np.zeros(100), -16000.0)]}, "audio[1]", "-16000 Hz is too low"),
        ({"audio": [tone, (np.zeros(100), 0.0)]}, "audio[1]", "0 Hz is too low"),
        ({"audio": [tone, (np.zeros((2, 100)), 16000)]}, "audio[1]", "1-D"),
        ({"audio": [tone, (np.full(100, np.nan), 16000)]}, "audio[1]", "NaN"),
        ({"audio": [tone, (np.zeros(31 * 16000), 16000)]}, "audio[1]", "longer than"),
        ({"audio": [tone, (np.zeros(100), 16000)]}, "audio[1]", "too short"),
        ({"audio": [tone, str(trunc_wav)]}, "audio[1]", "truncated"),
        ({"audio": [tone, b"RIFFjunk"]}, "audio[1]", "cannot read WAV"),
    ]


def test_bad_items_raise_value_error_naming_the_item(proc, tmp_path):
    for extra, item, reason in _bad_cases(tmp_path):
        prompt = {"prompt": "look", **extra}
        with pytest.raises(ValueError) as info:
            proc("req-3", prompt)
        message = str(info.value)
        assert f"prompt 'req-3': {item}: " in message and reason in message, message


def test_placeholder_count_mismatch(proc):
    img = _image(0)
    cases = [
        ({"prompt": "<|IMAGE|> and <|IMAGE|>", "images": [img]}, "2 images placeholder"),
        ({"prompt": "<|IMAGE|>", "images": [img, img]}, "1 images placeholder"),
        (
            {"prompt": "<|IMAGE|> hi", "images": [img], "audio": [(_tone() / 32768.0, 16000)]},
            "0 audio placeholder",
        ),
        ({"prompt": "<|AUDIO|> no audio"}, "1 audio placeholder"),
        ({"prompt": "<|IMAGE|><|IMAGE|><|IMAGE|>", "images": [img]}, "images[0]: placeholder run"),
    ]
    for prompt, reason in cases:
        with pytest.raises(ValueError, match="prompt 'req-3': ") as info:
            proc("req-3", prompt)
        assert reason in str(info.value), str(info.value)


# ---- encoder cache -------------------------------------------------------------------------------
def test_encoder_cache_lru_by_bytes_and_entries():
    row = torch.zeros(4, 8)  # 128 bytes
    cache = EncoderCache(max_bytes=3 * 128, max_entries=10)
    for name in "abc":
        cache.put(name, row.clone())
    assert cache.get("a") is not None  # a becomes most recent
    cache.put("d", row.clone())  # evicts b, the least recently used
    assert "b" not in cache and all(n in cache for n in "acd")
    assert cache.get("b") is None
    assert (cache.stats.hits, cache.stats.misses, cache.stats.evictions) == (1, 1, 1)
    cache.put("huge", torch.zeros(100, 8))  # larger than the budget: not kept, nothing evicted
    assert "huge" not in cache and len(cache) == 3 and cache.num_bytes == 3 * 128
    small = EncoderCache(max_bytes=1 << 20, max_entries=2)
    for name in "xyz":
        small.put(name, row.clone())
    assert len(small) == 2 and "x" not in small
