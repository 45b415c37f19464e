"""Tiny random-weight Qwen2.5-Omni checkpoints (thinker -> talker -> token2wav).

The directory loads with ``Qwen2_5OmniForConditionalGeneration.from_pretrained(dir)`` and holds:
``config.json`` (model_type ``qwen2_5_omni``), ``generation_config.json``, ``model.safetensors``,
``spk_dict.pt`` (speakers "Chelsie" and "Ethan"), the tokenizer (``tokenizer.json``,
``tokenizer_config.json``) and ``preprocessor_config.json`` (Qwen2-VL image processor and Whisper
feature extractor keys merged in one file, as in the real checkpoint).

Preprocessing without torchvision (``Qwen2_5OmniProcessor`` refuses to construct without a video
processor, which needs torchvision), see ``tools/omni_preprocess.py`` for a worked version::

    tok = AutoTokenizer.from_pretrained(dir)            # Qwen2Tokenizer; tok.image_token etc.
    img = Qwen2VLImageProcessorPil.from_pretrained(dir) # from transformers.models.qwen2_vl
    fe = WhisperFeatureExtractor.from_pretrained(dir)   # feature_size 128, 16 kHz
    # image: pixel_values [N, 3*2*14*14] + image_grid_thw [1, 3]; the prompt holds
    #   <|vision_bos|> + <|IMAGE|> * (grid_thw.prod() // merge_size**2) + <|vision_eos|>
    # audio: fe(wav, sampling_rate=16000, padding="max_length", return_attention_mask=True)
    #   -> input_features [1, 128, 3000], attention_mask -> feature_attention_mask; the prompt
    #   holds <|audio_bos|> + <|AUDIO|> * n + <|audio_eos|>, n = ((L - 1) // 2 + 1 - 2) // 2 + 1
    #   with L = feature_attention_mask.sum()
    model.generate(input_ids=ids, thinker_pixel_values=..., image_grid_thw=...,
                   input_features=..., feature_attention_mask=..., return_audio=True, ...)

Special-token ids are whatever the tokenizer assigns (appended after the BPE vocabulary); the
configs carry the same ids. Codec ids of the talker keep the real model's values (pad 8292,
start 8293, end 8294, mask 8296) because ``generate`` hard-codes ``talker_eos_token_id=[8292,
8294]``; the talker vocabulary therefore stays 8448. The DiT codec embedding covers the whole
talker vocabulary (real: 8193) so that any code a random talker samples can be decoded.
"""

from __future__ import annotations

import json
import math
import pathlib

import torch

# Order matters only in that ids are assigned in this order after the trained vocabulary.
SPECIALS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|AUDIO|>",
    "<|audio_bos|>",
    "<|audio_eos|>",
    "<|vision_bos|>",
    "<|vision_eos|>",
    "<|vision_pad|>",
    "<|IMAGE|>",
    "<|VIDEO|>",
    "<|tts_pad|>",
    "<|tts_bos|>",
    "<|tts_eos|>",
    "<|spk_Chelsie|>",
    "<|spk_Ethan|>",
]
# Named attributes the Qwen2.5-Omni processor reads from the tokenizer (tok.image_token, ...).
NAMED_TOKENS = {
    "image_token": "<|IMAGE|>",
    "audio_token": "<|AUDIO|>",
    "video_token": "<|VIDEO|>",
    "vision_bos_token": "<|vision_bos|>",
    "vision_eos_token": "<|vision_eos|>",
    "audio_bos_token": "<|audio_bos|>",
    "audio_eos_token": "<|audio_eos|>",
}
SPEAKERS = ("Chelsie", "Ethan")
CODEC = {"pad": 8292, "start": 8293, "end": 8294, "mask": 8296, "vocab": 8448}

SIZES = {
    "tiny": dict(
        vocab=512, hidden=128, layers=2, heads=4, kv_heads=2, inter=256, mrope=[4, 6, 6],
        vis_depth=2, vis_hidden=64, vis_heads=4, vis_inter=128,
        aud_layers=2, aud_dim=64, aud_heads=4, aud_ffn=128,
        talk_hidden=64, talk_layers=2, talk_heads=4, talk_kv=2, talk_inter=128, talk_mrope=[2, 3, 3],
        dit_hidden=64, dit_layers=2, dit_heads=4, dit_emb=32, enc=32,
        vgan_channels=128, vgan_kernels=[3], vgan_dilations=[[1, 3, 5]], ref_mel_len=48,
    ),
    "bench": dict(
        vocab=2048, hidden=512, layers=6, heads=8, kv_heads=4, inter=1536, mrope=[8, 12, 12],
        vis_depth=4, vis_hidden=256, vis_heads=4, vis_inter=512,
        aud_layers=4, aud_dim=256, aud_heads=4, aud_ffn=1024,
        talk_hidden=256, talk_layers=4, talk_heads=4, talk_kv=2, talk_inter=768,
        talk_mrope=[8, 12, 12], dit_hidden=256, dit_layers=4, dit_heads=4, dit_emb=64, enc=64,
        vgan_channels=256, vgan_kernels=[3, 7], vgan_dilations=[[1, 3, 5], [1, 3, 5]],
        ref_mel_len=96,
    ),
}  # fmt: skip

# Image processor limits: small images keep tests fast (at most 16 x 16 patches = 64 tokens).
PATCH, MERGE, TEMPORAL = 14, 2, 2
MIN_PIXELS, MAX_PIXELS = 56 * 56, 224 * 224


def omni_config(size: str, ids: dict[str, int]):
    """The composite config; ``ids`` maps special-token strings to tokenizer ids."""
    from transformers import Qwen2_5OmniConfig

    d = SIZES[size]
    mm = dict(
        image_token_index=ids["<|IMAGE|>"],
        video_token_index=ids["<|VIDEO|>"],
        audio_token_index=ids["<|AUDIO|>"],
        vision_start_token_id=ids["<|vision_bos|>"],
        vision_end_token_id=ids["<|vision_eos|>"],
        audio_start_token_id=ids["<|audio_bos|>"],
        audio_end_token_id=ids["<|audio_eos|>"],
    )
    text = dict(
        vocab_size=d["vocab"], hidden_size=d["hidden"], intermediate_size=d["inter"],
        num_hidden_layers=d["layers"], num_attention_heads=d["heads"],
        num_key_value_heads=d["kv_heads"], max_position_embeddings=4096, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": d["mrope"]},
        eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"],
    )  # fmt: skip
    vision = dict(
        depth=d["vis_depth"], hidden_size=d["vis_hidden"], num_heads=d["vis_heads"],
        intermediate_size=d["vis_inter"], out_hidden_size=d["hidden"], patch_size=PATCH,
        spatial_merge_size=MERGE, temporal_patch_size=TEMPORAL, window_size=112,
        fullatt_block_indexes=[d["vis_depth"] - 1],
    )  # fmt: skip
    audio = dict(
        num_mel_bins=128, encoder_layers=d["aud_layers"], encoder_attention_heads=d["aud_heads"],
        encoder_ffn_dim=d["aud_ffn"], d_model=d["aud_dim"], output_dim=d["hidden"],
        max_source_positions=1500, n_window=100,
    )  # fmt: skip
    thinker = dict(
        text_config=text, vision_config=vision, audio_config=audio,
        user_token_id=ids["<|im_start|>"], pad_token_id=ids["<|endoftext|>"], **mm,
    )  # fmt: skip
    talker = dict(
        vocab_size=CODEC["vocab"], embedding_size=d["hidden"], hidden_size=d["talk_hidden"],
        intermediate_size=d["talk_inter"], num_hidden_layers=d["talk_layers"],
        num_attention_heads=d["talk_heads"], num_key_value_heads=d["talk_kv"],
        head_dim=d["talk_hidden"] // d["talk_heads"], max_position_embeddings=4096,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6,
                         "mrope_section": d["talk_mrope"]},
        tts_text_start_token_id=ids["<|tts_bos|>"], tts_text_end_token_id=ids["<|tts_eos|>"],
        tts_text_pad_token_id=ids["<|tts_pad|>"], tts_codec_start_token_id=CODEC["start"],
        tts_codec_end_token_id=CODEC["end"], tts_codec_pad_token_id=CODEC["pad"],
        tts_codec_mask_token_id=CODEC["mask"], spatial_merge_size=MERGE, **mm,
    )  # fmt: skip
    enc = d["enc"]
    dit = dict(
        hidden_size=d["dit_hidden"], num_hidden_layers=d["dit_layers"],
        num_attention_heads=d["dit_heads"], head_dim=d["dit_hidden"] // d["dit_heads"],
        ff_mult=2, emb_dim=d["dit_emb"], block_size=24, look_ahead_layers=[1],
        look_backward_layers=[0, 1], repeats=2, num_embeds=CODEC["vocab"], mel_dim=80,
        dropout=0.0, enc_emb_dim=enc, enc_dim=enc, enc_channels=[enc, enc, enc, enc, 3 * enc],
        enc_attention_channels=enc // 2, enc_se_channels=enc // 2, enc_res2net_scale=2,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )  # fmt: skip
    bigvgan = dict(
        mel_dim=80, upsample_initial_channel=d["vgan_channels"],
        resblock_kernel_sizes=d["vgan_kernels"], resblock_dilation_sizes=d["vgan_dilations"],
        upsample_rates=[5, 3, 2, 2, 2, 2], upsample_kernel_sizes=[11, 7, 4, 4, 4, 4],
    )  # fmt: skip
    return Qwen2_5OmniConfig(
        thinker_config=thinker,
        talker_config=talker,
        token2wav_config=dict(dit_config=dit, bigvgan_config=bigvgan),
    )


def _save_processor_config(out_dir: pathlib.Path) -> None:
    save_processor_config(
        out_dir, "Qwen2_5OmniProcessor", PATCH, TEMPORAL, MERGE, MIN_PIXELS, MAX_PIXELS
    )


def save_processor_config(
    out_dir: pathlib.Path,
    processor_class: str,
    patch: int,
    temporal: int,
    merge: int,
    min_pixels: int,
    max_pixels: int,
    *,
    image_mean_std: float | None = None,
    audio_attention_mask: bool = True,
) -> None:
    """One preprocessor_config.json with both image-processor and feature-extractor keys (the
    Qwen omni families' layout). image_mean_std: the image mean and std for every channel
    (default: the processor's own)."""
    from transformers import WhisperFeatureExtractor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    norm = {} if image_mean_std is None else {"image_mean": [image_mean_std] * 3}
    if image_mean_std is not None:
        norm["image_std"] = [image_mean_std] * 3
    image = Qwen2VLImageProcessorPil(
        min_pixels=min_pixels,
        max_pixels=max_pixels,
        patch_size=patch,
        temporal_patch_size=temporal,
        merge_size=merge,
        **norm,
    )
    attention_mask = {"return_attention_mask": True} if audio_attention_mask else {}
    audio = WhisperFeatureExtractor(feature_size=128, sampling_rate=16000, **attention_mask)
    merged = {**audio.to_dict(), **image.to_dict()}
    merged["image_processor_type"] = "Qwen2VLImageProcessor"
    merged["feature_extractor_type"] = "WhisperFeatureExtractor"
    merged["processor_class"] = processor_class
    merged.pop("mel_filters", None)  # recomputed from feature_size/sampling_rate on load
    merged["min_pixels"], merged["max_pixels"] = min_pixels, max_pixels  # as the real file has
    text = json.dumps(merged, indent=2, sort_keys=True, default=_json_default) + "\n"
    (out_dir / "preprocessor_config.json").write_text(text)


def _json_default(obj):
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if hasattr(obj, "value"):  # enums such as PILImageResampling
        return obj.value
    raise TypeError(f"cannot serialise {type(obj).__name__} in preprocessor_config.json")


def _init_vocoder(vocoder: torch.nn.Module, seed: int) -> None:
    """Fan-in scaled convs, then scale the last conv so the waveform has std about 0.3.

    HF's init (std 0.02 for every conv) shrinks the signal at each of the six upsampling stages,
    giving a waveform of about 1e-7, i.e. silence; fan-in scaling alone saturates the final clamp
    to +-1. A probe mel calibrates the output gain instead, deterministically from the seed.
    """
    gen = torch.Generator().manual_seed(seed + 2)
    with torch.no_grad():
        for _, mod in sorted(vocoder.named_modules(), key=lambda kv: kv[0]):
            if isinstance(mod, torch.nn.ConvTranspose1d):
                fan_in = mod.weight.shape[0] * mod.weight.shape[2] / mod.stride[0]
            elif isinstance(mod, torch.nn.Conv1d):
                fan_in = mod.weight.shape[1] * mod.weight.shape[2]
            else:
                continue
            w = mod.weight
            w.copy_(torch.randn(w.shape, generator=gen) / math.sqrt(fan_in))
        seen = {}
        hook = vocoder.conv_post.register_forward_hook(lambda m, i, o: seen.update(out=o))
        vocoder(torch.randn(1, 80, 64, generator=gen) * 2)
        hook.remove()
        vocoder.conv_post.weight.mul_(0.3 / float(seen["out"].std()))


def build_omni(size: str, seed: int, out_dir: pathlib.Path) -> int:
    """Write the whole Qwen2.5-Omni directory into ``out_dir``; return #parameters."""
    from transformers import GenerationConfig, Qwen2_5OmniForConditionalGeneration

    from tools import tiny_tokenizer
    from tools.tiny_lm import init_lm_weights

    d = SIZES[size]
    tok = tiny_tokenizer.save_qwen2_tokenizer(out_dir, d["vocab"], SPECIALS, **NAMED_TOKENS)
    if len(tok) != d["vocab"]:
        raise RuntimeError(f"tokenizer has {len(tok)} tokens, thinker vocab is {d['vocab']}")
    ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIALS}
    config = omni_config(size, ids)
    torch.manual_seed(seed)  # HF init (encoders, DiT, BigVGAN filters) draws from the global RNG
    model = Qwen2_5OmniForConditionalGeneration(config).eval()
    # Decisive greedy choices for the two AR stages (see tools/tiny_lm.py for the reasons); the
    # encoders and token2wav keep HF's init, which their normalisations are designed for.
    names = [
        n
        for n, _ in model.named_parameters()
        if n.startswith(("thinker.model.", "thinker.lm_head", "talker."))
    ]
    init_lm_weights(model, seed, names)
    _init_vocoder(model.token2wav.code2wav_bigvgan_model, seed)
    model.save_pretrained(str(out_dir))
    eos = [ids["<|im_end|>"], ids["<|endoftext|>"]]
    GenerationConfig(eos_token_id=eos, pad_token_id=ids["<|endoftext|>"]).save_pretrained(
        str(out_dir)
    )
    gen = torch.Generator().manual_seed(seed + 1)
    spk = {
        name: {
            "bos_token": ids[f"<|spk_{name}|>"],
            "cond": torch.randn(1, d["enc"], generator=gen),
            "ref_mel": torch.randn(1, d["ref_mel_len"], 80, generator=gen),
        }
        for name in SPEAKERS
    }
    torch.save(spk, out_dir / "spk_dict.pt")
    _save_processor_config(out_dir)
    return sum(p.numel() for p in model.parameters())
