"""Tiny random-weight Qwen3-Omni checkpoints (thinker -> talker + code predictor -> code2wav).

The directory loads with ``Qwen3OmniMoeForConditionalGeneration.from_pretrained(dir)`` and holds
``config.json`` (model_type ``qwen3_omni_moe``), ``generation_config.json``,
``model.safetensors``, the tokenizer and ``preprocessor_config.json`` (image processor and
Whisper feature extractor keys in one file, as in the real checkpoint).

transformers 5.23 reads four fields its config classes do not declare; each is set here:
``thinker_config.vision_start_token_id`` (the thinker's rope index), ``talker_config.
spatial_merge_size`` (the talker's rope index), ``talker_config.text_config.
shared_expert_intermediate_size`` (the talker's shared expert) and ``talker_config.speaker_id``
(voice name -> codec id; None crashes ``generate``). Speakers here: "ethan", "chelsie", "aiden"
(lower case, as ``generate`` looks them up with ``speaker.lower()``).

Codec layout as in the real model, scaled down: the talker vocabulary is ``codebook + 1024``;
``generate`` suppresses ``[vocab - 1024, vocab)`` except codec EOS, so layer-0 codes are codebook
entries and every codec special id (pad, bos, eos, think ids, speakers) sits above them.

Randomly initialised code2wav is near-silent (peak ~1e-7: every upsampling stage shrinks the
signal); its convolutions are re-drawn fan-in scaled and its last conv scaled so that a probe
decode has std about 0.3, so tests can tell audio from silence.

The role words "system", "user" and "assistant" are single tokens (as in the real tokenizer):
``generate`` finds user turns by the token after each ``<|im_start|>``.
"""

from __future__ import annotations

import math
import pathlib

import torch

from tools.tiny_omni import save_processor_config

SPECIALS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|audio_start|>",
    "<|audio_end|>",
    "<|audio_pad|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<|tts_pad|>",
    "<|tts_bos|>",
    "<|tts_eos|>",
    "system",
    "user",
    "assistant",
]
NAMED_TOKENS = {
    "image_token": "<|image_pad|>",
    "audio_token": "<|audio_pad|>",
    "video_token": "<|video_pad|>",
    "vision_bos_token": "<|vision_start|>",
    "vision_eos_token": "<|vision_end|>",
    "audio_bos_token": "<|audio_start|>",
    "audio_eos_token": "<|audio_end|>",
}
SPEAKERS = ("ethan", "chelsie", "aiden")
CODEBOOK = 64
# Codec special ids, above the codebook (the real model: 2048 + 100..110).
CODEC = {"pad": CODEBOOK + 4, "bos": CODEBOOK + 5, "eos": CODEBOOK + 6,
         "nothink": CODEBOOK + 11, "think_bos": CODEBOOK + 12, "think_eos": CODEBOOK + 13}  # fmt: skip
SPEAKER_IDS = {name: CODEBOOK + 20 + i for i, name in enumerate(SPEAKERS)}

SIZES = {
    "tiny": dict(
        vocab=512, hidden=64, layers=3, heads=4, kv_heads=2, experts=4, top_k=2, moe_inter=32,
        mrope=[4, 2, 2], accept_layer=2,
        vis_depth=3, vis_hidden=32, vis_heads=4, vis_inter=64, deepstack=[0, 1],
        aud_layers=2, aud_dim=32, aud_heads=4, aud_ffn=64, aud_down=16,
        talk_hidden=32, talk_layers=2, talk_heads=4, talk_kv=2, talk_inter=64, talk_experts=4,
        talk_top_k=2, talk_moe_inter=32, talk_mrope=[2, 1, 1], groups=4,
        cp_layers=1, c2w_hidden=32, c2w_layers=1, c2w_heads=4, c2w_decoder=32,
        upsample_rates=[4, 3], upsampling_ratios=[2, 2], c2w_window=8,
    ),
    # bench/omni_pipeline.py --family qwen3_omni_moe: the real model's 16 code groups and code2wav
    # upsampling (1920 samples per frame, 12.5 frames/s) and sliding window, small widths.
    "bench": dict(
        vocab=2048, hidden=256, layers=4, heads=4, kv_heads=2, experts=8, top_k=2, moe_inter=128,
        mrope=[16, 8, 8], accept_layer=2,
        vis_depth=2, vis_hidden=64, vis_heads=4, vis_inter=128, deepstack=[0, 1],
        aud_layers=2, aud_dim=64, aud_heads=4, aud_ffn=128, aud_down=32,
        talk_hidden=128, talk_layers=3, talk_heads=4, talk_kv=2, talk_inter=256, talk_experts=8,
        talk_top_k=2, talk_moe_inter=128, talk_mrope=[8, 4, 4], groups=16,
        cp_layers=2, c2w_hidden=128, c2w_layers=2, c2w_heads=4, c2w_decoder=96,
        upsample_rates=[8, 5, 4, 3], upsampling_ratios=[2, 2], c2w_window=72,
    ),
}  # fmt: skip

PATCH, MERGE, TEMPORAL = 16, 2, 2
MIN_PIXELS, MAX_PIXELS = 64 * 64, 256 * 256


def omni_config(size: str, ids: dict[str, int]):
    """The composite config; ``ids`` maps special-token strings to tokenizer ids."""
    from transformers import Qwen3OmniMoeConfig

    d = SIZES[size]
    mm = dict(
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        audio_token_id=ids["<|audio_pad|>"], audio_start_token_id=ids["<|audio_start|>"],
        vision_start_token_id=ids["<|vision_start|>"], position_id_per_seconds=13,
    )  # fmt: skip
    head_dim = d["hidden"] // d["heads"]
    text = dict(
        vocab_size=d["vocab"], hidden_size=d["hidden"], intermediate_size=2 * d["hidden"],
        num_hidden_layers=d["layers"], num_attention_heads=d["heads"], head_dim=head_dim,
        num_key_value_heads=d["kv_heads"], num_experts=d["experts"],
        num_experts_per_tok=d["top_k"], moe_intermediate_size=d["moe_inter"],
        max_position_embeddings=4096, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": d["mrope"],
                         "interleaved": True},
    )  # fmt: skip
    vision = dict(
        depth=d["vis_depth"], hidden_size=d["vis_hidden"], num_heads=d["vis_heads"],
        intermediate_size=d["vis_inter"], out_hidden_size=d["hidden"], patch_size=PATCH,
        spatial_merge_size=MERGE, temporal_patch_size=TEMPORAL, num_position_embeddings=64,
        deepstack_visual_indexes=d["deepstack"],
    )  # fmt: skip
    audio = dict(
        num_mel_bins=128, encoder_layers=d["aud_layers"], encoder_attention_heads=d["aud_heads"],
        encoder_ffn_dim=d["aud_ffn"], d_model=d["aud_dim"], output_dim=d["hidden"],
        downsample_hidden_size=d["aud_down"], max_source_positions=1500, n_window=50,
        n_window_infer=800,
    )  # fmt: skip
    thinker = dict(
        text_config=text, vision_config=vision, audio_config=audio,
        user_token_id=ids["user"], **mm,
    )  # fmt: skip
    talk_head = d["talk_hidden"] // d["talk_heads"]
    talker_text = dict(
        vocab_size=CODEBOOK + 1024, hidden_size=d["talk_hidden"], intermediate_size=d["talk_inter"],
        num_hidden_layers=d["talk_layers"], num_attention_heads=d["talk_heads"],
        num_key_value_heads=d["talk_kv"], head_dim=talk_head, num_experts=d["talk_experts"],
        num_experts_per_tok=d["talk_top_k"], moe_intermediate_size=d["talk_moe_inter"],
        shared_expert_intermediate_size=d["talk_moe_inter"], max_position_embeddings=4096,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6,
                         "mrope_section": d["talk_mrope"], "interleaved": True},
    )  # fmt: skip
    predictor = dict(
        vocab_size=CODEBOOK, hidden_size=d["talk_hidden"], intermediate_size=d["talk_inter"],
        num_hidden_layers=d["cp_layers"], num_attention_heads=d["talk_heads"],
        num_key_value_heads=d["talk_kv"], head_dim=talk_head, num_code_groups=d["groups"],
        max_position_embeddings=64, rope_parameters={"rope_type": "default", "rope_theta": 1e6},
    )  # fmt: skip
    talker = dict(
        text_config=talker_text, code_predictor_config=predictor, num_code_groups=d["groups"],
        thinker_hidden_size=d["hidden"], accept_hidden_layer=d["accept_layer"],
        codec_eos_token_id=CODEC["eos"], codec_nothink_id=CODEC["nothink"],
        codec_think_bos_id=CODEC["think_bos"], codec_think_eos_id=CODEC["think_eos"],
        codec_pad_id=CODEC["pad"], codec_bos_id=CODEC["bos"], speaker_id=dict(SPEAKER_IDS),
        spatial_merge_size=MERGE, **mm,
    )  # fmt: skip
    code2wav = dict(
        codebook_size=CODEBOOK, hidden_size=d["c2w_hidden"], num_hidden_layers=d["c2w_layers"],
        num_attention_heads=d["c2w_heads"], num_key_value_heads=d["c2w_heads"],
        intermediate_size=2 * d["c2w_hidden"], sliding_window=d["c2w_window"], num_quantizers=d["groups"],
        upsample_rates=d["upsample_rates"], upsampling_ratios=d["upsampling_ratios"],
        decoder_dim=d["c2w_decoder"], max_position_embeddings=4096,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )  # fmt: skip
    return Qwen3OmniMoeConfig(
        thinker_config=thinker,
        talker_config=talker,
        code2wav_config=code2wav,
        im_start_token_id=ids["<|im_start|>"],
        im_end_token_id=ids["<|im_end|>"],
        tts_pad_token_id=ids["<|tts_pad|>"],
        tts_bos_token_id=ids["<|tts_bos|>"],
        tts_eos_token_id=ids["<|tts_eos|>"],
        system_token_id=ids["system"],
        user_token_id=ids["user"],
        assistant_token_id=ids["assistant"],
    )


def _save_processor_config(out_dir: pathlib.Path) -> None:
    save_processor_config(
        out_dir,
        "Qwen3OmniMoeProcessor",
        PATCH,
        TEMPORAL,
        MERGE,
        MIN_PIXELS,
        MAX_PIXELS,
        image_mean_std=0.5,
        audio_attention_mask=False,
    )


def init_code2wav(code2wav: torch.nn.Module, seed: int) -> None:
    """Fan-in scaled convolutions, then the last conv scaled so a probe decode has std ~0.3."""
    gen = torch.Generator().manual_seed(seed + 2)
    with torch.no_grad():
        for _, mod in sorted(code2wav.named_modules(), key=lambda kv: kv[0]):
            if isinstance(mod, torch.nn.ConvTranspose1d):
                fan_in = mod.weight.shape[0] * mod.weight.shape[2] / mod.stride[0]
            elif isinstance(mod, torch.nn.Conv1d):
                fan_in = mod.weight.shape[1] * mod.weight.shape[2] / mod.groups
            else:
                continue
            w = mod.weight
            w.copy_(torch.randn(w.shape, generator=gen) / math.sqrt(fan_in))
        last = code2wav.decoder[-1].conv
        probe = torch.randint(0, code2wav.config.codebook_size, (1, code2wav.config.num_quantizers, 16),
                              generator=gen)  # fmt: skip
        seen = {}
        hook = last.register_forward_hook(lambda m, i, o: seen.update(out=o))
        code2wav(probe)
        hook.remove()
        last.weight.mul_(0.3 / float(seen["out"].std()))
        if last.bias is not None:
            last.bias.mul_(0.3 / float(seen["out"].std()))


def build_omni(size: str, seed: int, out_dir: pathlib.Path) -> int:
    """Write the whole Qwen3-Omni directory into ``out_dir``; return #parameters."""
    from transformers import GenerationConfig, Qwen3OmniMoeForConditionalGeneration

    from tools import tiny_tokenizer
    from tools.tiny_lm import init_lm_weights

    d = SIZES[size]
    tok = tiny_tokenizer.save_qwen2_tokenizer(out_dir, d["vocab"], SPECIALS, **NAMED_TOKENS)
    if len(tok) != d["vocab"]:
        raise RuntimeError(f"tokenizer has {len(tok)} tokens, thinker vocab is {d['vocab']}")
    ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIALS}
    config = omni_config(size, ids)
    torch.manual_seed(seed)  # HF init (encoders, code2wav) draws from the global RNG
    model = Qwen3OmniMoeForConditionalGeneration(config).eval()
    # Decisive greedy choices for the AR parts (tools/tiny_lm.py); encoders keep HF's init.
    params = dict(model.named_parameters())
    names = [
        n
        for n, p in params.items()
        if n.startswith(("thinker.model.language_model.", "thinker.lm_head", "talker."))
        and p.ndim <= 2
    ]
    init_lm_weights(model, seed, names)
    gen = torch.Generator().manual_seed(seed + 3)
    with torch.no_grad():  # expert weights [experts, out, in]: fan-in scaled like the others
        for name in sorted(params):
            p = params[name]
            if p.ndim == 3 and name.startswith(("thinker.model.language_model.", "talker.")):
                p.copy_(torch.randn(p.shape, generator=gen) * (1.5 / math.sqrt(p.shape[2])))
    init_code2wav(model.code2wav, seed)
    if size == "bench":
        # Random codec heads often pick codec EOS first, and transformers' generate crashes on a
        # first code that is EOS: a zero EOS row (logit 0) lets the bench speak every frame.
        with torch.no_grad():
            model.talker.codec_head.weight[CODEC["eos"]] = 0.0
    model.save_pretrained(str(out_dir))
    eos = [ids["<|im_end|>"], ids["<|endoftext|>"]]
    GenerationConfig(eos_token_id=eos, pad_token_id=ids["<|endoftext|>"]).save_pretrained(
        str(out_dir)
    )
    _save_processor_config(out_dir)
    return sum(p.numel() for p in model.parameters())
