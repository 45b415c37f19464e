"""Qwen2.5-Omni talker and token2wav stages against transformers on the tiny checkpoint.

The references come from one full `Qwen2_5OmniForConditionalGeneration.generate` per case
(greedy talker), observed from the inside (tests/integration/omni_reference.py):
- "unmasked": one unpadded request, as transformers 5.23 runs it (it drops the all-ones mask);
- "masked": row 0 of a left-padded batch of two, where generate keeps the mask and the talker
  takes its mrope + codec-prefix path (our default thinker_to_talker).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from helpers import OMNI_ON_CPU

from omni.config import load_config
from omni.core.sampling_params import SamplingParams
from omni.engine import StageEngine, create_engine
from omni.messages import StageInput
from stages.qwen2_5_omni.input_processors import (
    talker_to_token2wav,
    thinker_to_talker,
    thinker_to_talker_unmasked,
)
from tests.integration.omni_reference import (
    OmniReference,
    load_hf,
    prompt_input,
    run_generate,
    thinker_result,
)
from tools.make_tiny_checkpoint import ensure_checkpoint

pytestmark = pytest.mark.slow

THINKER_TOKENS, TALKER_TOKENS = 6, 24
PROMPT = [5, 17, 99, 100, 3, 7, 8, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51]
SHORT = [9, 10, 11]
CODEC_STOP = (8292, 8294)


@pytest.fixture(scope="module")
def omni_dir() -> str:
    torch.set_num_threads(1)
    return str(ensure_checkpoint("qwen2_5_omni", "tiny"))


@pytest.fixture(scope="module")
def refs(omni_dir) -> dict[str, OmniReference]:
    model = load_hf(omni_dir)
    kw = dict(thinker_tokens=THINKER_TOKENS, talker_tokens=TALKER_TOKENS, seed=3)
    unmasked = run_generate(model, [PROMPT], **kw)[0]
    masked = run_generate(model, [PROMPT, SHORT], **kw)[0]
    return {"unmasked": unmasked, "masked": masked}


def talker_engine(model_dir: str, caching: bool, **engine: object) -> StageEngine:
    stage = {
        "name": "talker",
        "model": model_dir,
        "adapter": "qwen2_5_omni_talker",
        "engine": {
            "block_size": 4,
            "num_blocks": 64,
            "enable_prefix_caching": caching,
            "device": "cpu",  # as the reference
            **engine,
        },
    }
    return StageEngine(load_config({"stages": [stage]}).stages[0])


def talker_input(ref: OmniReference, mode: str, request_id: str) -> StageInput:
    processor = thinker_to_talker if mode == "masked" else thinker_to_talker_unmasked
    stage_input = processor(thinker_result(ref, request_id), prompt_input(ref, request_id))
    params = SamplingParams(max_tokens=TALKER_TOKENS, stop_token_ids=CODEC_STOP)
    return dataclasses.replace(stage_input, sampling_params=params)


@pytest.mark.parametrize(
    ("caching", "engine_kwargs"),
    [
        (True, {}),
        (False, {}),
        (True, {"cuda_graphs": True, "max_num_seqs": 3}),
        (True, {"cuda_graphs": True, "max_num_seqs": 4, "async_scheduling": True}),
        (False, {"cuda_graphs": True, "async_scheduling": True, "num_blocks": 14}),
    ],
    ids=["caching", "no-caching", "padded-decode", "ahead", "ahead-preempted"],
)
def test_talker_codes_equal_transformers(omni_dir, refs, caching, engine_kwargs):
    """padded-decode: decode steps padded to the CUDA-graph ladder (1, 2, 3), run eagerly here,
    with the text rows gathered before the body as on a GPU. ahead: decode steps launched before
    the last one's codes were read, their codec ids (embedding and penalty) taken on the device;
    -preempted: in a pool too small for all four requests."""
    engine = talker_engine(omni_dir, caching, **engine_kwargs)
    # Each mode twice: with caching on, the repeat is served from the prefix cache.
    for round_ in range(2):
        for mode, ref in refs.items():
            engine.add_request(talker_input(ref, mode, f"{mode}{round_}"))
    results = {r.request_id: r for r in engine.run_until_done()}
    assert refs["masked"].codes != refs["unmasked"].codes  # the two modes really differ
    for mode, ref in refs.items():
        for round_ in range(2):
            result = results[f"{mode}{round_}"]
            assert result.token_ids == ref.codes, (mode, round_)
            if caching and round_ == 1:
                assert result.num_cached_tokens > 0
            if not caching:
                assert result.num_cached_tokens == 0
    stats = engine.stats()
    if engine_kwargs:
        assert stats["padded_decode_steps"] > 0
    assert (stats["steps_launched_ahead"] > 0) == engine_kwargs.get("async_scheduling", False)
    if "num_blocks" in engine_kwargs:
        assert stats["preemptions"] > 0, stats


# Below 1 the "penalty" rewards seen codes: the tiny model's 24 codes never repeat under 1.05,
# but with 0.5 they repeat generated codes (5437, 2952, then 5705 on and on).
STRONG_PENALTY = 0.5


@pytest.fixture(scope="module")
def strong(omni_dir) -> OmniReference:
    """A reference whose codes depend on the generated codes' history."""
    model = load_hf(omni_dir)
    kw = dict(thinker_tokens=THINKER_TOKENS, talker_tokens=TALKER_TOKENS, seed=3)
    return run_generate(model, [PROMPT], **kw, talker_repetition_penalty=STRONG_PENALTY)[0]


@pytest.mark.parametrize(
    "engine_kwargs",
    [
        {},
        {"cuda_graphs": True},
        {"cuda_graphs": True, "async_scheduling": True},
        {"cuda_graphs": True, "async_scheduling": True, "num_blocks": 16},
    ],
    ids=["eager", "padded-decode", "ahead", "ahead-preempted"],
)
def test_talker_penalty_over_generated_codes_equals_transformers(
    omni_dir, refs, strong, engine_kwargs
):
    """Generated codes enter the penalty as they are sampled, on the device (talker_penalty.py):
    equal to transformers with a penalty that changes the codes, steps ahead included."""
    assert strong.codes != refs["unmasked"].codes  # the penalty over generated codes bites
    engine = talker_engine(omni_dir, True, **engine_kwargs)
    for i in range(2):
        stage_input = talker_input(strong, "unmasked", f"s{i}")
        extras = {**stage_input.extras, "repetition_penalty": STRONG_PENALTY}
        engine.add_request(dataclasses.replace(stage_input, extras=extras))
    results = engine.run_until_done()
    assert [r.token_ids for r in results] == [strong.codes] * 2
    stats = engine.stats()
    assert (stats["steps_launched_ahead"] > 0) == engine_kwargs.get("async_scheduling", False)
    if "num_blocks" in engine_kwargs:  # recomputed after preemption: the history stays
        assert stats["preemptions"] > 0, stats


def test_talker_rejects_bad_extras(omni_dir, refs):
    engine = talker_engine(omni_dir, True)
    good = talker_input(refs["masked"], "masked", "bad")
    short = dict(good.extras, thinker_hidden=good.extras["thinker_hidden"][:-1])
    with pytest.raises(ValueError, match="thinker_hidden"):
        engine.add_request(dataclasses.replace(good, extras=short))
    with pytest.raises(ValueError, match="speaker"):
        engine.add_request(dataclasses.replace(good, extras=dict(good.extras, speaker="Nobody")))
    assert not engine.has_unfinished


def test_token2wav_equals_transformers(omni_dir, refs):
    config = load_config(
        {
            "stages": [
                {
                    "name": "token2wav",
                    "model": omni_dir,
                    "kind": "generation",
                    "adapter": "qwen2_5_omni_token2wav",
                    "engine": {"seed": 3, "device": "cpu"},
                }
            ]
        }
    )
    engine = create_engine(config.stages[0])
    for mode, ref in refs.items():
        upstream = {"talker": thinker_result(ref)["thinker"]}
        upstream["talker"] = dataclasses.replace(
            upstream["talker"], stage="talker", token_ids=ref.codes
        )
        engine.add_request(
            dataclasses.replace(talker_to_token2wav(upstream, prompt_input(ref)), request_id=mode)
        )
    with pytest.raises(ValueError, match="codec id"):
        engine.add_request(StageInput("bad", [10**6]))
    # A talker that stopped at once (codec EOS first): an empty waveform, not an error.
    ref = next(iter(refs.values()))
    upstream["talker"] = dataclasses.replace(upstream["talker"], token_ids=[8294, 5, 6])
    silent = talker_to_token2wav(upstream, prompt_input(ref))
    assert silent.prompt_token_ids == []
    engine.add_request(dataclasses.replace(silent, request_id="silent"))
    results = {r.request_id: r for r in engine.run_until_done()}
    assert results.pop("silent").audio.numel() == 0
    for mode, ref in refs.items():
        wav = results[mode].audio
        assert results[mode].sample_rate == 24000
        assert wav.dim() == 1 and wav.shape == ref.wav.shape
        torch.testing.assert_close(wav, ref.wav, atol=1e-4, rtol=1e-3)
    assert engine.stats()["stage"] == "token2wav"


def test_pipeline_equals_transformers_generate(omni_dir, refs):
    from omni import Omni

    overrides = {"stages.talker.input_processor": "thinker_to_talker_unmasked", **OMNI_ON_CPU}
    params = [
        SamplingParams(max_tokens=THINKER_TOKENS, ignore_eos=True),
        SamplingParams(max_tokens=TALKER_TOKENS, stop_token_ids=CODEC_STOP),
        SamplingParams(max_tokens=1, seed=3),
    ]
    ref = refs["unmasked"]
    with Omni(model=omni_dir, runtime={"backend": "local"}, **overrides) as omni:
        out = omni.generate([{"prompt_token_ids": PROMPT}], params, use_tqdm=False)[0]
    assert out.error is None, out.error
    assert out.stages["thinker"].token_ids == ref.thinker_ids
    assert out.stages["talker"].token_ids == ref.codes
    torch.testing.assert_close(out.final.audio, ref.wav, atol=1e-4, rtol=1e-3)
