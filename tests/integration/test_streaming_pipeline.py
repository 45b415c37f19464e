"""Streaming speech end to end (local backend, tiny Qwen2.5-Omni) against transformers' generate.

With stream_audio the talker starts while the thinker is still writing and token2wav decodes
codes in chunks while the talker is still speaking. The thinker and talker tokens must still equal
transformers' exactly, the thinker rows the talker consumed must equal the rows of the finished
thinker result, audio must come in several chunks (the first before the talker finishes) that join
into the whole waveform within the documented bound of the exact whole-sequence decode, and a
repeated prompt must still be served from the prefix caches.
"""

from __future__ import annotations

import math

import pytest
import torch
from helpers import OMNI_ON_CPU

from omni import Omni
from omni.core.sampling_params import SamplingParams
from tests.integration.omni_reference import load_hf, run_generate
from tools.omni_preprocess import OmniPreprocessor

pytestmark = pytest.mark.slow

THINKER_TOKENS, TALKER_TOKENS, SEED = 12, 60, 3
TEXT = "tell me what you notice in it, with every colour and every shape you can see there"
PARAMS = [
    SamplingParams(max_tokens=THINKER_TOKENS, ignore_eos=True),
    SamplingParams(max_tokens=TALKER_TOKENS, stop_token_ids=(8292, 8294)),
    SamplingParams(max_tokens=1, seed=SEED),
]
MIN_SNR_DB = 55.0  # docs/streaming.md: 12 codes of context each side (the YAML's)


@pytest.fixture(scope="module")
def reference(omni_dir):
    model = load_hf(omni_dir)
    model.thinker.generation_config.eos_token_id = None  # exactly THINKER_TOKENS on both sides
    ids = OmniPreprocessor(omni_dir)(TEXT)["input_ids"][0].tolist()
    (ref,) = run_generate(
        model, [ids], thinker_tokens=THINKER_TOKENS, talker_tokens=TALKER_TOKENS, seed=SEED
    )
    return ref


class RowSpy:
    """Records the thinker rows the talker adapter is handed (its first input, then pieces)."""

    def __init__(self, talker) -> None:
        self.rows: dict[str, list[torch.Tensor]] = {"hidden": [], "embeds": []}
        check, extend = talker.check_inputs, talker.extend_inputs

        def check_inputs(stage_input):
            self.rows = {"hidden": [], "embeds": []}
            self._take(stage_input.extras)
            return check(stage_input)

        def extend_inputs(request_id, delta):
            self._take(delta.extras)
            return extend(request_id, delta)

        talker.check_inputs, talker.extend_inputs = check_inputs, extend_inputs

    def _take(self, extras) -> None:
        if "thinker_hidden" in extras:
            self.rows["hidden"].append(extras["thinker_hidden"].clone())
            self.rows["embeds"].append(extras["thinker_embeds"].clone())


def _snr_db(signal: torch.Tensor, approx: torch.Tensor) -> float:
    noise = (signal - approx).pow(2).sum().item()
    return math.inf if noise == 0 else 10 * math.log10(signal.pow(2).sum().item() / noise)


@pytest.mark.parametrize("padded", [False, True, "ahead"], ids=["eager", "padded-decode", "ahead"])
def test_streaming_speech_matches_transformers(omni_dir, reference, padded):
    """padded-decode: the thinker's and the talker's decode steps take the CUDA-graph path
    (run eagerly here), the talker's while its thinker rows still stream in. ahead: the thinker's
    and the talker's decode steps also launched one ahead of their ids (engine.async_scheduling):
    the thinker's streamed rows never those of the step in flight, the talker's steps ahead
    while the thinker's rows come, wherever it has the row of the position it feeds next."""
    overrides = {
        "stages.talker.input_processor": "thinker_to_talker_unmasked",
        "stages.token2wav.stream.chunk_size": 20,  # 60 codes: chunks of 10, 20, 20, 10
        **OMNI_ON_CPU,
    }
    if padded:
        overrides |= {f"stages.{s}.engine.cuda_graphs": True for s in ("thinker", "talker")}
    if padded == "ahead":
        overrides |= {f"stages.{s}.engine.async_scheduling": True for s in ("thinker", "talker")}
    runtime = {"backend": "local", "return_tensors": "all"}  # the thinker's rows, to compare
    with Omni(model=omni_dir, runtime=runtime, **overrides) as omni:
        spy = RowSpy(omni.backend.hosts["talker"].engine.model)

        async def stream():
            return [
                o
                async for o in omni.async_omni.generate({"prompt": TEXT}, PARAMS, stream_audio=True)
            ]

        rounds = [omni._call(stream()) for _ in range(2)]
        rows = {k: torch.cat(v) for k, v in spy.rows.items()}
        exact = omni.generate([{"prompt": TEXT}], PARAMS, use_tqdm=False)[0]
        stats = omni.stats()
    for stage in ("thinker", "talker"):
        assert (stats[stage].get("padded_decode_steps", 0) > 0) == bool(padded), stage
    for stage in ("thinker", "talker"):
        assert (stats[stage]["steps_launched_ahead"] > 0) == (padded == "ahead"), stage
    for round_, snapshots in enumerate(rounds):
        out = snapshots[-1]
        assert out.finished and out.error is None, out.error
        assert out.stages["thinker"].token_ids == reference.thinker_ids
        assert out.stages["talker"].token_ids == reference.codes
        # The talker started before the thinker finished (routed its first rows: its first codes
        # may still reach the caller later on a busy machine), token2wav before the talker did.
        started, finished = out.stages["talker"].timings, out.stages["thinker"].timings
        assert started["started_s"] < finished["finished_s"], (started, finished)
        chunks = [len(s.final.audio) for s in snapshots if s.final.stage == "token2wav"]
        assert len(set(chunks)) > 2, chunks  # several chunks (growing), then the whole
        first = next(
            s for s in snapshots if s.final.stage == "token2wav" and s.final.audio is not None
        )
        assert not first.stages["talker"].finished
        audio = out.final.audio
        assert audio.shape == reference.wav.shape
        assert _snr_db(reference.wav, audio) >= MIN_SNR_DB
        assert 0 < out.final.timings["first_audio_s"] < out.final.timings["finished_s"]
        for stage in ("thinker", "talker"):
            assert (out.stages[stage].num_cached_tokens > 0) == (round_ == 1), stage
    # The rows the talker consumed (the spy keeps the last request's) are the rows of the
    # finished thinker result, bit for bit, and transformers' within float tolerance.
    thinker = rounds[-1][-1].stages["thinker"].tensors
    assert torch.equal(rows["hidden"], thinker["hidden_states"])
    assert torch.equal(rows["embeds"], thinker["inputs_embeds"])
    torch.testing.assert_close(rows["hidden"], reference.hidden, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(rows["embeds"], reference.embeds, atol=1e-5, rtol=1e-4)
    # Streaming off: the exact whole-sequence path.
    assert exact.stages["talker"].token_ids == reference.codes
    torch.testing.assert_close(exact.final.audio, reference.wav, atol=1e-4, rtol=1e-3)


def test_streaming_under_preemption_keeps_the_codes(omni_dir):
    """A talker pool too small for four streaming requests preempts them (recompute stops at
    each one's input limit); the codes still equal the unstreamed run with a roomy pool."""
    prompts = [f"request number {i}: tell me something about the number {i}" for i in range(4)]
    params = [PARAMS[0], SamplingParams(max_tokens=60, stop_token_ids=(8292, 8294)), PARAMS[2]]
    with Omni(model=omni_dir, runtime={"backend": "local"}, **OMNI_ON_CPU) as omni:
        reference = omni.generate(prompts, params, use_tqdm=False)
    tiny_pool = {
        "stages.talker.engine.num_blocks": 10,
        "stages.talker.engine.block_size": 16,
        **OMNI_ON_CPU,
    }
    with Omni(model=omni_dir, runtime={"backend": "local"}, **tiny_pool) as omni:
        streamed = omni.generate(prompts, params, use_tqdm=False, stream_audio=True)
        assert omni.stats()["talker"]["preemptions"] > 0
    for want, got in zip(reference, streamed, strict=True):
        assert got.error is None, got.error
        assert got.stages["talker"].token_ids == want.stages["talker"].token_ids
        assert len(got.final.audio) == len(want.final.audio)
