"""The tiny Qwen2.5-Omni pipeline with every stage on a CUDA GPU (local backend), against one
transformers `generate` per prompt (run on the CPU in float32, as in
tests/integration/test_omni_pipeline.py): thinker tokens and talker codes equal in float32, with
prefix caching on and off, tiny KV pools (evictions) and both output-cache devices; bfloat16
(the GPU default) runs end to end and its agreement is printed; streaming speech runs on the GPU.

Waveforms are checked for shape and finiteness only: on a GPU the DiT draws its noise from the
GPU's generator, so the samples differ from the CPU reference's (docs/gpu.md).

Every test needs a GPU (`cuda` marker: skipped where torch sees none)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from omni import Omni
from omni.config import load_config
from omni.engine import StageEngine
from stages.qwen2_5_omni.input_processors import _before_eos
from tests.integration.omni_reference import load_hf, run_generate
from tests.integration.test_omni_pipeline import (
    PARAMS,
    build_references,
)
from tests.integration.test_omni_pipeline import _cases as pipeline_cases
from tests.integration.test_omni_talker import PROMPT, SHORT, talker_input

pytestmark = [pytest.mark.cuda, pytest.mark.slow]

STAGES = ("thinker", "talker", "token2wav")


def _overrides(caching: bool, output_cache_device: str, dtype: str | None) -> dict:
    overrides: dict = {"stages.talker.input_processor": "thinker_to_talker_unmasked"}
    for stage in STAGES:
        overrides[f"stages.{stage}.engine.device"] = "cuda"
    for stage in ("thinker", "talker"):
        engine = f"stages.{stage}.engine"
        overrides[f"{engine}.enable_prefix_caching"] = caching
        overrides[f"{engine}.dtype"] = dtype
        overrides[f"{engine}.output_cache_device"] = output_cache_device
        # Tiny pools: the three requests of a round need more blocks than there are.
        overrides[f"{engine}.block_size"] = 4
        overrides[f"{engine}.num_blocks"] = 48
        overrides[f"{engine}.max_model_len"] = 160
    return overrides


@pytest.fixture(scope="module")
def references(omni_dir):
    return build_references(omni_dir)


def _check_audio(out, omni: Omni) -> None:
    adapter = omni.backend.hosts["token2wav"].engine.model
    codes = _before_eos(list(out.stages["talker"].token_ids))
    assert out.final.audio.device.type == "cpu"
    assert out.final.audio.shape == (len(codes) * adapter.samples_per_code,)
    assert bool(torch.isfinite(out.final.audio).all())


@pytest.mark.parametrize(
    ("caching", "output_cache_device"),
    [(True, "cpu"), (False, "cpu"), (True, "cuda")],
    ids=["caching-pinned", "no-caching-pinned", "caching-gpu-cache"],
)
def test_float32_pipeline_on_cuda_equals_transformers(
    omni_dir, references, caching, output_cache_device
):
    prompts = {name: prompt for name, (prompt, _, _) in pipeline_cases().items()}
    overrides = _overrides(caching, output_cache_device, "float32")
    with Omni(model=omni_dir, runtime={"backend": "local"}, **overrides) as omni:
        rounds = [omni.generate(list(prompts.values()), PARAMS, use_tqdm=False) for _ in range(2)]
        stats = omni.stats()
        for outputs in rounds:
            for name, out in zip(prompts, outputs, strict=True):
                ref = references[name]
                assert out.error is None, out.error
                assert out.stages["thinker"].prompt_token_ids == ref.prompt_ids, name
                assert out.stages["thinker"].token_ids == ref.thinker_ids, name
                assert out.stages["talker"].token_ids == ref.codes, name
                _check_audio(out, omni)
    for stage in STAGES:
        assert stats[stage]["device"] == "cuda:0", stage
        assert stats[stage]["dtype"] == "float32", stage
        assert stats[stage]["memory_allocated_bytes"] > 0, stage
    for stage in ("thinker", "talker"):
        assert stats[stage]["output_cache_device"] in (output_cache_device, "cuda:0")
        assert stats[stage]["graph_steps"] > 0, stage  # replayed, not a silent eager fallback
        if caching:  # the tiny pools evict cached blocks between and within the rounds
            assert stats[stage]["kv_hit_tokens"] > 0 and stats[stage]["kv_evictions"] > 0, stage


@pytest.mark.parametrize("caching", [True, False], ids=["caching", "no-caching"])
def test_float32_talker_on_cuda_with_preemption_equals_transformers(omni_dir, caching):
    """The talker alone, fed transformers' thinker rows (CPU tensors moved to the GPU by the
    adapter), in a pool so small that decoding preempts and recomputes requests."""
    model = load_hf(omni_dir)
    kw = {"thinker_tokens": 6, "talker_tokens": 24, "seed": 3}
    refs = {
        "unmasked": run_generate(model, [PROMPT], **kw)[0],
        "masked": run_generate(model, [PROMPT, SHORT], **kw)[0],
    }
    stage = {
        "name": "talker",
        "model": omni_dir,
        "adapter": "qwen2_5_omni_talker",
        "engine": {
            "block_size": 4,
            "num_blocks": 30,  # 4 requests of up to 12 blocks each
            "enable_prefix_caching": caching,
            "device": "cuda",
            "dtype": "float32",
        },
    }
    engine = StageEngine(load_config({"stages": [stage]}).stages[0])
    for round_ in range(2):
        for mode, ref in refs.items():
            engine.add_request(talker_input(ref, mode, f"{mode}{round_}"))
    results = {r.request_id: r for r in engine.run_until_done()}
    for mode, ref in refs.items():
        for round_ in range(2):
            assert results[f"{mode}{round_}"].token_ids == ref.codes, (mode, round_)
    stats = engine.stats()
    assert stats["preemptions"] > 0 and stats["device"] == "cuda:0", stats
    assert stats["graph_steps"] > 0, stats  # preempted between replayed steps


def test_bfloat16_pipeline_on_cuda_runs_and_reports_agreement(omni_dir, references):
    """dtype null on a GPU: bfloat16 thinker and talker, float32 token2wav."""
    prompts = {name: prompt for name, (prompt, _, _) in pipeline_cases().items()}
    with Omni(
        model=omni_dir, runtime={"backend": "local"}, **_overrides(True, "cpu", None)
    ) as omni:
        outputs = omni.generate(list(prompts.values()), PARAMS, use_tqdm=False)
        stats = omni.stats()
        for out in outputs:
            assert out.error is None, out.error
            _check_audio(out, omni)
    assert stats["thinker"]["dtype"] == stats["talker"]["dtype"] == "bfloat16"
    assert stats["token2wav"]["dtype"] == "float32"
    assert stats["thinker"]["graph_steps"] > 0 and stats["talker"]["graph_steps"] > 0
    for stage, field in (("thinker", "thinker_ids"), ("talker", "codes")):
        pairs = [
            (a, b)
            for name, out in zip(prompts, outputs, strict=True)
            for a, b in zip(
                out.stages[stage].token_ids, getattr(references[name], field), strict=False
            )
        ]
        share = sum(a == b for a, b in pairs) / max(len(pairs), 1)
        print(f"\n[bfloat16 omni {stage}] equal tokens {share:.1%} of {len(pairs)}")


def test_streaming_speech_on_cuda(omni_dir):
    """Streamed audio (talker fed thinker rows as they come, token2wav in chunks) on the GPU:
    pieces join to the finished waveform."""
    sampling = {
        "stages.thinker.sampling.max_tokens": 8,
        "stages.thinker.sampling.ignore_eos": True,
        "stages.talker.sampling.max_tokens": 96,
        "stages.talker.sampling.ignore_eos": True,
    }
    devices = {f"stages.{s}.engine.device": "cuda" for s in STAGES}
    params = [
        dataclasses.replace(PARAMS[0], max_tokens=8),
        dataclasses.replace(PARAMS[1], max_tokens=96, ignore_eos=True),
        PARAMS[2],
    ]
    with Omni(model=omni_dir, runtime={"backend": "local"}, **sampling, **devices) as omni:
        results = list(omni.stream({"prompt": "tell me about the sea"}, params, stream_audio=True))
    pieces = [r for r in results if not r.finished]
    whole = results[-1].audio
    assert len(pieces) > 1 and whole.device.type == "cpu"
    assert torch.equal(torch.cat([r.audio for r in pieces]), whole)
    assert bool(torch.isfinite(whole).all())
