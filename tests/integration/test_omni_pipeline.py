"""The whole Qwen2.5-Omni pipeline (thinker -> talker -> token2wav, local backend) against one
transformers `generate` per prompt, for text-only, image + text and audio + text prompts, with
prefix caching on and off; the same prompt sent twice is served from the caches, unchanged.

transformers 5.23 runs a single unpadded request with the talker's unmasked path (see
test_omni_talker.py), so these runs select the `thinker_to_talker_unmasked` edge. The DiT noise
is seeded the same on both sides: transformers after `torch.manual_seed(seed)`, ours from the
token2wav stage's SamplingParams.seed.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import OMNI_ON_CPU
from PIL import Image

from omni import Omni
from omni.core.sampling_params import SamplingParams
from tests.integration.omni_reference import load_hf, run_generate
from tools.omni_preprocess import OmniPreprocessor

pytestmark = pytest.mark.slow

THINKER_TOKENS, TALKER_TOKENS, SEED = 5, 20, 3
CHAT = "<|im_start|>user\n{mm}{text}<|im_end|>\n<|im_start|>assistant\n"
TEXT = "tell me what you notice in it, with every colour and every shape you can see there"
PARAMS = [
    SamplingParams(max_tokens=THINKER_TOKENS, ignore_eos=True),
    SamplingParams(max_tokens=TALKER_TOKENS, stop_token_ids=(8292, 8294)),
    SamplingParams(max_tokens=1, seed=SEED),
]


def _cases() -> dict[str, tuple[dict, str, dict]]:
    """name -> (our prompt, transformers text, transformers media)."""
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (84, 112, 3), dtype=np.uint8))
    audio = (np.sin(np.arange(16000) / 9.0) * 0.4, 16000)
    return {
        "text": ({"prompt": TEXT}, TEXT, {}),
        "image": (
            {"prompt": TEXT, "images": [image]},
            CHAT.format(mm="<|vision_bos|><|IMAGE|><|vision_eos|>", text=TEXT),
            {"images": [image]},
        ),
        "audio": (
            {"prompt": TEXT, "audio": [audio]},
            CHAT.format(mm="<|audio_bos|><|AUDIO|><|audio_eos|>", text=TEXT),
            {"audios": [audio[0].astype(np.float32)]},
        ),
    }


def build_references(omni_dir: str) -> dict:
    """transformers' generate on every case (also the GPU tests' oracle: tests/cuda)."""
    model = load_hf(omni_dir)
    model.thinker.generation_config.eos_token_id = None  # exactly THINKER_TOKENS on both sides
    pre = OmniPreprocessor(omni_dir)
    refs = {}
    for name, (_, text, media) in _cases().items():
        inputs = pre(text, **media)
        kwargs = pre.generate_kwargs(inputs)
        ids = kwargs.pop("input_ids")[0].tolist()
        kwargs.pop("attention_mask", None)
        refs[name] = run_generate(
            model,
            [ids],
            thinker_tokens=THINKER_TOKENS,
            talker_tokens=TALKER_TOKENS,
            seed=SEED,
            media=kwargs,
        )[0]
    return refs


@pytest.fixture(scope="module")
def references(omni_dir):
    return build_references(omni_dir)


@pytest.mark.parametrize("caching", [True, False], ids=["caching", "no-caching"])
def test_pipeline_equals_transformers(omni_dir, references, caching):
    overrides = {"stages.talker.input_processor": "thinker_to_talker_unmasked", **OMNI_ON_CPU}
    for stage in ("thinker", "talker"):
        overrides[f"stages.{stage}.engine.enable_prefix_caching"] = caching
    prompts = {name: prompt for name, (prompt, _, _) in _cases().items()}
    with Omni(model=omni_dir, runtime={"backend": "local"}, **overrides) as omni:
        rounds = [omni.generate(list(prompts.values()), PARAMS, use_tqdm=False) for _ in range(2)]
        thinker = omni.backend.hosts["thinker"].engine.model
        assert thinker.encoder_runs == {"image": 1, "audio": 1}  # once per distinct item
    for round_, outputs in enumerate(rounds):
        for name, out in zip(prompts, outputs, strict=True):
            ref = references[name]
            assert out.error is None, out.error
            assert out.stages["thinker"].prompt_token_ids == ref.prompt_ids, name
            assert out.stages["thinker"].token_ids == ref.thinker_ids, name
            assert out.stages["talker"].token_ids == ref.codes, name
            assert out.final.sample_rate == 24000
            torch.testing.assert_close(out.final.audio, ref.wav, atol=1e-4, rtol=1e-3)
            for stage in ("thinker", "talker"):
                cached = out.stages[stage].num_cached_tokens
                assert (cached > 0) == (caching and round_ == 1), (name, stage, round_)
