"""A Qwen3-Omni checkpoint built here, not by tools/tiny_qwen3_omni.py: its own dims (head
sizes, layers, experts, top-k, num_code_groups, codebook, upsampling), codec ids and speakers
("vivian", "ryan"; no "ethan"), transformers' own random init, and a thinker vocabulary larger
than its tokenizer (as in the real checkpoint). `Omni(model=DIR)` on it gives the thinker tokens,
every code group of every frame and the waveform of `generate` (CPU float32 greedy), for text,
image and audio prompts; a prompt that names no voice gets the checkpoint's first one.

Only the tokenizer and preprocessor_config.json are copied from the project's tiny checkpoint.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
from PIL import Image

from omni import Omni
from omni.core.sampling_params import SamplingParams
from tests.integration.qwen3_omni_reference import load_hf, run_generate

pytestmark = pytest.mark.slow

CODEBOOK, GROUPS = 48, 3
CODEC = {"codec_eos_token_id": CODEBOOK + 1, "codec_pad_id": CODEBOOK + 2,
         "codec_bos_id": CODEBOOK + 3, "codec_nothink_id": CODEBOOK + 7,
         "codec_think_bos_id": CODEBOOK + 8, "codec_think_eos_id": CODEBOOK + 9}  # fmt: skip
SPEAKERS = {"vivian": CODEBOOK + 30, "ryan": CODEBOOK + 31}
SEED = 1  # codes differ by speaker and input; 9 frames each (not an early codec EOS)
THINKER_TOKENS, TALKER_TOKENS = 5, 10
PARAMS = [
    SamplingParams(max_tokens=THINKER_TOKENS, ignore_eos=True),
    SamplingParams(max_tokens=TALKER_TOKENS),
    SamplingParams(max_tokens=1),
]
ON_CPU = {f"stages.{s}.engine.device": "cpu" for s in ("thinker", "talker", "code2wav")}
RUNTIME = {"backend": "local", "return_tensors": "all"}  # the talker's tensors["codes"] too
TEXT = "what do you hear and see here, in a few words"


def _config(tok):
    from transformers import Qwen3OmniMoeConfig

    ids = {t: tok.convert_tokens_to_ids(t) for t in tok.all_special_tokens}
    mm = dict(
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        audio_token_id=ids["<|audio_pad|>"], audio_start_token_id=ids["<|audio_start|>"],
        vision_start_token_id=ids["<|vision_start|>"], position_id_per_seconds=13,
    )  # fmt: skip
    rope = {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 1, 1],
            "interleaved": True}  # fmt: skip
    text = dict(
        vocab_size=len(tok) + 8, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=6, head_dim=8, num_key_value_heads=3, num_experts=6,
        num_experts_per_tok=3, moe_intermediate_size=24, rope_parameters=rope,
        tie_word_embeddings=False,
    )  # fmt: skip
    vision = dict(
        depth=2, hidden_size=24, num_heads=3, intermediate_size=48, out_hidden_size=48,
        patch_size=16, spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=36,
        deepstack_visual_indexes=[1],
    )  # fmt: skip
    audio = dict(
        num_mel_bins=128, encoder_layers=1, encoder_attention_heads=3, encoder_ffn_dim=48,
        d_model=24, output_dim=48, downsample_hidden_size=8, n_window=50, n_window_infer=400,
    )  # fmt: skip
    talker_text = dict(
        vocab_size=CODEBOOK + 1024, hidden_size=40, intermediate_size=80, num_hidden_layers=1,
        num_attention_heads=5, num_key_value_heads=1, head_dim=8, num_experts=3,
        num_experts_per_tok=1, moe_intermediate_size=16, shared_expert_intermediate_size=24,
        rope_parameters=rope,
    )  # fmt: skip
    predictor = dict(
        vocab_size=CODEBOOK, hidden_size=40, intermediate_size=80, num_hidden_layers=2,
        num_attention_heads=5, num_key_value_heads=5, head_dim=8, num_code_groups=GROUPS,
        rope_parameters={"rope_type": "default", "rope_theta": 1e4},
    )  # fmt: skip
    talker = dict(
        text_config=talker_text, code_predictor_config=predictor, num_code_groups=GROUPS,
        thinker_hidden_size=48, accept_hidden_layer=1, speaker_id=SPEAKERS,
        spatial_merge_size=2, **CODEC, **mm,
    )  # fmt: skip
    code2wav = dict(
        codebook_size=CODEBOOK, hidden_size=24, num_hidden_layers=2, num_attention_heads=3,
        num_key_value_heads=3, intermediate_size=40, sliding_window=4, num_quantizers=GROUPS,
        upsample_rates=[2, 5], upsampling_ratios=[2], decoder_dim=16,
        rope_parameters={"rope_type": "default", "rope_theta": 1e4},
    )  # fmt: skip
    return Qwen3OmniMoeConfig(
        thinker_config=dict(text_config=text, vision_config=vision, audio_config=audio,
                            user_token_id=ids["user"], **mm),
        talker_config=talker, code2wav_config=code2wav,
        im_start_token_id=ids["<|im_start|>"], im_end_token_id=ids["<|im_end|>"],
        tts_pad_token_id=ids["<|tts_pad|>"], tts_bos_token_id=ids["<|tts_bos|>"],
        tts_eos_token_id=ids["<|tts_eos|>"], system_token_id=ids["system"],
        user_token_id=ids["user"], assistant_token_id=ids["assistant"],
    )  # fmt: skip


@pytest.fixture(scope="module")
def foreign_dir(tmp_path_factory, one_torch_thread):
    return build(tmp_path_factory.mktemp("qwen3_foreign"))


def build(out):
    from transformers import AutoTokenizer, GenerationConfig, Qwen3OmniMoeForConditionalGeneration

    from tools.make_tiny_checkpoint import ensure_checkpoint

    tiny = ensure_checkpoint("qwen3_omni_moe", "tiny")
    for name in ("tokenizer.json", "tokenizer_config.json", "preprocessor_config.json"):
        shutil.copy(tiny / name, out / name)
    tok = AutoTokenizer.from_pretrained(str(out))
    torch.manual_seed(SEED)
    model = Qwen3OmniMoeForConditionalGeneration(_config(tok)).eval()
    # transformers 5.23 leaves the talker's fused expert weights as torch.empty (whatever the
    # allocator hands back: NaN after other tests ran): give them values.
    with torch.no_grad():
        for name, param in model.talker.named_parameters():
            if ".mlp.experts." in name:
                param.normal_(0.0, model.config.talker_config.initializer_range)
    # transformers' init leaves code2wav near-silent: scale its last conv so audio is audible.
    last = model.code2wav.decoder[-1].conv
    with torch.no_grad():
        probe = model.code2wav(torch.randint(0, CODEBOOK, (1, GROUPS, 12)))
        # the output is clamped to [-1, 1]; below that it is linear in the last conv
        scale = 0.3 / float(probe.std())
        last.weight.mul_(scale)
        last.bias.mul_(scale)
    model.save_pretrained(str(out))
    eos = [tok.convert_tokens_to_ids("<|im_end|>")]
    GenerationConfig(eos_token_id=eos, pad_token_id=eos[0]).save_pretrained(str(out))
    return str(out)


def _prompts() -> dict[str, dict]:
    image = Image.fromarray(np.random.default_rng(3).integers(0, 256, (64, 96, 3), np.uint8))
    audio = (np.cos(np.arange(12000) / 5.0) * 0.3, 16000)
    return {
        "text": {"prompt": TEXT, "speaker": "Vivian"},
        "image": {"prompt": TEXT, "images": [image], "speaker": "RYAN"},
        "audio": {"prompt": TEXT, "audio": [audio], "speaker": "vivian"},
        "default-voice": {"prompt": TEXT},  # the first voice in sorted order: "ryan"
    }


def test_foreign_checkpoint_equals_transformers(foreign_dir):
    from stages.qwen3_omni_moe.prompt_processor import Qwen3OmniPromptProcessor

    prompts = _prompts()
    model = load_hf(foreign_dir)
    processor = Qwen3OmniPromptProcessor(foreign_dir)
    refs = {}
    for name, prompt in prompts.items():
        inputs = processor(name, {k: v for k, v in prompt.items() if k != "speaker"})
        refs[name] = run_generate(
            model, inputs.prompt_token_ids, dict(inputs.extras), thinker_tokens=THINKER_TOKENS,
            talker_tokens=TALKER_TOKENS, speaker=prompt.get("speaker", "ryan"),
        )  # fmt: skip
    with Omni(model=foreign_dir, runtime=RUNTIME, **ON_CPU) as omni:
        assert omni.async_omni.voices == ["ryan", "vivian"]
        outputs = omni.generate(list(prompts.values()), PARAMS, use_tqdm=False)
    for (name, ref), out in zip(refs.items(), outputs, strict=True):
        assert out.error is None, (name, out.error)
        assert out.stages["thinker"].token_ids == ref.thinker_ids, name
        talker = out.stages["talker"]
        assert talker.token_ids == ref.layer0, name
        assert talker.tensors["codes"].shape == (len(ref.layer0), GROUPS), name
        assert talker.tensors["codes"][:-1].tolist() == ref.frames, name
        assert torch.equal(out.final.audio, ref.wav), name
        assert len(ref.frames) >= 2 and float(ref.wav.abs().max()) > 0.05, name
    # the voice matters: same prompt, other speaker, other codes
    assert refs["text"].frames != refs["default-voice"].frames
