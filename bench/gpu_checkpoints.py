"""Random-weight checkpoints at real layouts for bench/gpu.py, built once and cached.

Checkpoints (built once into the checkpoint cache of tools/make_tiny_checkpoint.py, then reused):

* ``omni_checkpoint(layout)``: a Qwen2.5-Omni directory as our stage loaders and transformers
  read it (config.json, safetensors, generation_config.json, tokenizer, preprocessor config,
  spk_dict.pt). ``tiny`` is tools/tiny_omni.py's test layout; ``7b`` is Qwen2.5-Omni-7B's
  (thinker 28 x 3584 with its vision and audio towers, talker 24 x 896, DiT 22 x 1024, BigVGAN
  1536 channels: 10.7 B parameters, about 21 GiB in bf16 with token2wav in fp32), built on the
  given device with transformers' own random init. Its tokenizer is tools/tiny_tokenizer.py's
  2048-token BPE: the thinker's embedding keeps the 7B's 152064 rows (prompts are token ids).
  In both, the talker's codec-head rows of the codec EOS ids (8292, 8294) are zero, so that
  greedy decoding never picks them (their logit is 0, the others' maximum is far above) and
  every request produces exactly the codec budget on both sides.
* ``decoder_checkpoint(layout)``: a plain Qwen2 causal LM. ``tiny`` is tools/tiny_lm.py's
  (the cached tests checkpoint); ``0.5b`` has Qwen2.5-0.5B's layout (24 x 896, 14 heads / 2 KV
  heads, vocab 151936, tied embeddings: 494 M parameters).
"""

from __future__ import annotations

import contextlib
import pathlib
from collections.abc import Callable, Iterator
from typing import Any, cast

import torch

from tools.make_tiny_checkpoint import cache_root, cached_build, ensure_checkpoint

CODEC_EOS = (8292, 8294)  # codec pad / codec end: where both sides' talkers stop
# Bump when the generated content changes: cached directories of an older version are rebuilt.
BUILD_VERSION = "1"
_VERSION_FILE = ".gpu_bench_version"
DECODER_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TOKENIZER_VOCAB = 2048  # BPE tokens of the 7b/0.5b tokenizers (the embeddings stay full size)

# Qwen2.5-Omni-7B's published config.json (values that differ from transformers' defaults are
# spelled out; the DiT and BigVGAN defaults are the 7B's).
OMNI_7B: dict[str, dict[str, Any]] = dict(
    text=dict(
        vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
        num_attention_heads=28, num_key_value_heads=4, max_position_embeddings=32768,
        rms_norm_eps=1e-6, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [16, 24, 24]},
    ),
    vision=dict(
        depth=32, hidden_size=1280, num_heads=16, intermediate_size=3420, out_hidden_size=3584,
        patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=112,
        fullatt_block_indexes=[7, 15, 23, 31],
    ),
    audio=dict(
        num_mel_bins=128, encoder_layers=32, encoder_attention_heads=20, encoder_ffn_dim=5120,
        d_model=1280, output_dim=3584, max_source_positions=1500, n_window=100,
    ),
    talker=dict(
        vocab_size=8448, embedding_size=3584, hidden_size=896, intermediate_size=18944,
        num_hidden_layers=24, num_attention_heads=12, num_key_value_heads=4, head_dim=128,
        max_position_embeddings=32768, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [16, 24, 24]},
    ),
    # num_embeds: the whole talker vocabulary (the real 8193 misses codes a random talker emits)
    dit=dict(
        hidden_size=1024, num_hidden_layers=22, num_attention_heads=16, head_dim=64, ff_mult=2,
        emb_dim=512, block_size=24, look_ahead_layers=[10], look_backward_layers=[0, 20],
        repeats=2, num_embeds=8448, mel_dim=80, dropout=0.1, enc_emb_dim=192, enc_dim=128,
        enc_channels=[256, 256, 256, 256, 768], enc_attention_channels=64, enc_se_channels=64,
        enc_res2net_scale=2, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    ),
    bigvgan=dict(
        mel_dim=80, upsample_initial_channel=1536, resblock_kernel_sizes=[3, 7, 11],
        resblock_dilation_sizes=[[1, 3, 5], [1, 3, 5], [1, 3, 5]],
        upsample_rates=[5, 3, 2, 2, 2, 2], upsample_kernel_sizes=[11, 7, 4, 4, 4, 4],
    ),
)  # fmt: skip
REF_MEL_LEN_7B = 300  # reference-mel frames of the random speakers

# Qwen2.5-0.5B's config.json (sliding window off, as it is in practice).
QWEN2_0_5B = dict(
    vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
    num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
    rms_norm_eps=1e-6, tie_word_embeddings=True, use_sliding_window=False,
)  # fmt: skip


def _marker_ok(path: pathlib.Path) -> bool:
    marker = path / _VERSION_FILE
    return marker.is_file() and marker.read_text().strip() == BUILD_VERSION


def _cached(name: str, build: Callable[[pathlib.Path], None]) -> pathlib.Path:
    def build_and_mark(tmp: pathlib.Path) -> None:
        build(tmp)
        (tmp / _VERSION_FILE).write_text(BUILD_VERSION + "\n")

    return cached_build(cache_root() / name, _marker_ok, build_and_mark)


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """No progress bars, and no warnings about the composite config's token ids (true of the
    real checkpoint too: text ids lie outside the talker's codec vocabulary)."""
    from transformers.utils import logging as hf_logging

    bars, level = hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()


@contextlib.contextmanager
def _build_on(device: str, dtype: torch.dtype) -> Iterator[None]:
    """Modules created inside are allocated on `device` with `dtype` (transformers' init runs
    there: a 10 B model builds on a GPU in about a second)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            yield
    finally:
        torch.set_default_dtype(previous)


# The token-id fields of the composite config, as tools/tiny_omni.py's config sets them (they do
# not depend on the layout): the multimodal ids of thinker and talker, the talker's tts and codec.
MM_IDS = (
    "image_token_index", "video_token_index", "audio_token_index", "vision_start_token_id",
    "vision_end_token_id", "audio_start_token_id", "audio_end_token_id",
)  # fmt: skip
THINKER_IDS = (*MM_IDS, "user_token_id", "pad_token_id")
TALKER_IDS = (
    *MM_IDS, "tts_text_start_token_id", "tts_text_end_token_id", "tts_text_pad_token_id",
    "tts_codec_start_token_id", "tts_codec_end_token_id", "tts_codec_pad_token_id",
    "tts_codec_mask_token_id",
)  # fmt: skip


def omni_7b_config(ids: dict[str, int]) -> Any:
    """The Qwen2.5-Omni-7B layout with our tokenizer's special-token ids, in the fields where
    tools/tiny_omni.omni_config puts them (its tiny config is built only to read them off)."""
    from transformers import Qwen2_5OmniConfig

    from tools.tiny_omni import omni_config

    tiny = omni_config("tiny", ids)

    def fields(config: Any, names: tuple[str, ...]) -> dict[str, Any]:
        return {name: getattr(config, name) for name in names}

    d = OMNI_7B
    text = dict(
        d["text"], **fields(tiny.thinker_config.text_config, ("eos_token_id", "pad_token_id"))
    )
    thinker = dict(
        text_config=text,
        vision_config=d["vision"],
        audio_config=d["audio"],
        **fields(tiny.thinker_config, THINKER_IDS),
    )
    talker = dict(d["talker"], spatial_merge_size=2, **fields(tiny.talker_config, TALKER_IDS))
    return Qwen2_5OmniConfig(
        thinker_config=thinker,
        talker_config=talker,
        token2wav_config=dict(dit_config=d["dit"], bigvgan_config=d["bigvgan"]),
    )


def build_omni(layout: str, out: pathlib.Path, device: str, seed: int = 0) -> int:
    """Write a Qwen2.5-Omni checkpoint of `layout` (tiny | 7b) into `out`; return #parameters."""
    from transformers import GenerationConfig, Qwen2_5OmniForConditionalGeneration

    from tools import tiny_omni, tiny_tokenizer
    from tools.tiny_lm import init_lm_weights

    size = cast(dict[str, int], tiny_omni.SIZES["tiny"])
    vocab = size["vocab"] if layout == "tiny" else TOKENIZER_VOCAB
    tok = tiny_tokenizer.save_qwen2_tokenizer(
        out, vocab, tiny_omni.SPECIALS, **tiny_omni.NAMED_TOKENS
    )
    ids = {t: tok.convert_tokens_to_ids(t) for t in tiny_omni.SPECIALS}
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)  # no-op without CUDA
    if layout == "tiny":
        config = tiny_omni.omni_config("tiny", ids)
        model = Qwen2_5OmniForConditionalGeneration(config).eval()
        names = [
            n
            for n, _ in model.named_parameters()
            if n.startswith(("thinker.model.", "thinker.lm_head", "talker."))
        ]
        init_lm_weights(model, seed, names)  # the tests checkpoint's decisive greedy choices
        enc, ref_mel_len = size["enc"], size["ref_mel_len"]
        build_device = "cpu"
    else:
        config = omni_7b_config(ids)
        # bf16 weights (token2wav: fp32, transformers casts it); transformers' init on `device`.
        dtype = torch.bfloat16
        with _build_on(device, dtype):
            model = Qwen2_5OmniForConditionalGeneration(config).eval()
        enc, ref_mel_len = int(OMNI_7B["dit"]["enc_emb_dim"]), REF_MEL_LEN_7B
        build_device = device
    # The vocoder's calibration (an audible waveform, not 1e-7) probes it with a CPU input.
    vocoder = model.token2wav.code2wav_bigvgan_model
    vocoder.to("cpu")
    tiny_omni._init_vocoder(vocoder, seed)
    vocoder.to(build_device)
    with torch.no_grad():
        model.talker.codec_head.weight[list(CODEC_EOS)] = 0.0
    model.save_pretrained(str(out))
    eos = [ids["<|im_end|>"], ids["<|endoftext|>"]]
    GenerationConfig(eos_token_id=eos, pad_token_id=ids["<|endoftext|>"]).save_pretrained(str(out))
    gen = torch.Generator().manual_seed(seed + 1)
    speakers = {
        name: {
            "bos_token": ids[f"<|spk_{name}|>"],
            "cond": torch.randn(1, enc, generator=gen),
            "ref_mel": torch.randn(1, ref_mel_len, 80, generator=gen),
        }
        for name in tiny_omni.SPEAKERS
    }
    torch.save(speakers, out / "spk_dict.pt")
    tiny_omni._save_processor_config(out)
    n = sum(p.numel() for p in model.parameters())
    del model
    return n


def omni_checkpoint(layout: str, device: str, seed: int = 0) -> pathlib.Path:
    """The cached Qwen2.5-Omni checkpoint of `layout`, built on `device` the first time."""
    if layout not in ("tiny", "7b"):
        raise ValueError(f"unknown Qwen2.5-Omni layout {layout!r}: tiny or 7b")

    def build(tmp: pathlib.Path) -> None:
        with _quiet_transformers():
            build_omni(layout, tmp, device, seed)

    return _cached(f"gpu-bench-qwen2_5_omni-{layout}-seed{seed}", build)


def build_decoder_0_5b(out: pathlib.Path, device: str, seed: int = 0) -> int:
    """Qwen2.5-0.5B's layout with transformers' random init, saved in bf16."""
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    from tools import tiny_tokenizer

    tok = tiny_tokenizer.save_qwen2_tokenizer(out, TOKENIZER_VOCAB, DECODER_SPECIALS)
    eos = tok.convert_tokens_to_ids("<|endoftext|>")
    config = Qwen2Config(
        **QWEN2_0_5B, rope_theta=1e6, bos_token_id=eos, eos_token_id=eos, pad_token_id=eos
    )
    config.dtype = "bfloat16"
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)
    with _build_on(device, torch.bfloat16):
        model = Qwen2ForCausalLM(config).eval()
    model.save_pretrained(str(out))
    GenerationConfig(bos_token_id=eos, eos_token_id=eos, pad_token_id=eos).save_pretrained(str(out))
    n = sum(p.numel() for p in model.parameters())
    del model
    return n


def decoder_checkpoint(layout: str, device: str, seed: int = 0) -> pathlib.Path:
    """tiny: tools/tiny_lm.py's cached Qwen2 checkpoint; 0.5b: Qwen2.5-0.5B's layout."""
    if layout == "tiny":
        return ensure_checkpoint("qwen2", "tiny", seed)
    if layout != "0.5b":
        raise ValueError(f"unknown decoder layout {layout!r}: tiny or 0.5b")

    def build(tmp: pathlib.Path) -> None:
        with _quiet_transformers():
            build_decoder_0_5b(tmp, device, seed)

    return _cached(f"gpu-bench-qwen2-0.5b-seed{seed}", build)
