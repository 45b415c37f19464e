"""The soak's judgements without a server (tools/soak.py, tools/soak_requests.py): what counts as
a divergence, a failure of the run, and the plan it sends. The run itself:
tests/integration/test_soak.py."""

from __future__ import annotations

import io
import wave

import numpy as np
import openai  # noqa: F401 - tools.soak needs it; conftest.py leaves this module out without it
import pytest

from tools.soak import KindStats, RssSample, ServerState, SoakConfig, SoakReport, plan
from tools.soak_requests import KINDS, REFERENCE_KIND, Answer, diverges, prompt_wav


def _pcm(*samples: int) -> bytes:
    return np.array(samples, "<i2").tobytes()


def test_diverges_text_exactly_audio_within_one_step():
    ref = Answer("a b", _pcm(0, 100, -5))
    assert diverges(Answer("a b", _pcm(1, 99, -5)), ref) is None
    assert "text" in diverges(Answer("a c", _pcm(0, 100, -5)), ref)
    assert "2 int16 steps" in diverges(Answer("a b", _pcm(0, 102, -5)), ref)
    assert "samples" in diverges(Answer("a b", _pcm(0, 100)), ref)
    assert "only one" in diverges(Answer("a b"), ref)
    assert diverges(Answer("x"), Answer("x")) is None


def _report(**changes) -> SoakReport:
    config = SoakConfig(num_requests=10, rss_every=5)
    kinds = {kind: KindStats() for kind in KINDS}
    kinds["chat_text"].count = 10
    report = SoakReport(
        config,
        kinds,
        [RssSample(5, 100, 200), RssSample(10, 104, 209)],
        end=ServerState(0, 0, {"thinker": {"num_requests": 0, "kv_blocks_in_use": 0}}),
    )
    for key, value in changes.items():
        setattr(report, key, value)
    return report


def test_failures_name_each_broken_rule():
    assert _report().failures() == []
    assert _report().rss_growth() == pytest.approx((0.04, 0.045))
    grown = _report(rss=[RssSample(5, 100, 200), RssSample(10, 105, 200)])
    assert "RSS grew 5.0% (server)" in grown.failures()[0]
    busy = ServerState(0, 0, {"thinker": {"num_requests": 0, "kv_blocks_in_use": 3}})
    assert "not idle" in _report(end=busy).failures()[0]
    assert "not idle" in _report(end=ServerState(1, 0, {})).failures()[0]
    assert "not idle" in _report(end=None).failures()[0]
    lost = _report()
    lost.kinds["chat_text"].errors = 1
    lost.kinds["chat_text"].examples = ["#3 prompt 0: APITimeoutError"]
    assert lost.failures() == ["chat_text: 1 errors, 0 diverged, e.g. #3 prompt 0: APITimeoutError"]
    short = _report()
    short.kinds["chat_text"].count = 9
    assert short.failures() == ["9 of 10 requests completed"]


def test_plan_is_seeded_and_mixes_every_kind():
    config = SoakConfig(num_requests=2000, num_prompts=7)
    jobs = plan(config)
    assert jobs == plan(config) != plan(SoakConfig(num_requests=2000, num_prompts=7, seed=1))
    assert [j.index for j in jobs] == list(range(2000))
    assert {j.prompt for j in jobs} == set(range(7))
    for kind, share in KINDS.items():
        assert abs(sum(j.kind == kind for j in jobs) / 2000 - share) < 0.03, kind
    assert set(REFERENCE_KIND) | {"disconnect", "bad"} == set(KINDS)
    assert sum(KINDS.values()) == pytest.approx(1.0)


def test_config_rejects_bad_values_naming_the_field():
    with pytest.raises(ValueError, match=r"SoakConfig.concurrency must be >= 1, got 0"):
        SoakConfig(concurrency=0)
    with pytest.raises(ValueError, match=r"SoakConfig.rss_every must be >= 0, got -1"):
        SoakConfig(rss_every=-1)
    assert SoakConfig(num_requests=10_000).rss_interval == 1000


def test_prompt_wav_is_a_distinct_16k_wav_per_prompt():
    with wave.open(io.BytesIO(prompt_wav(3))) as f:
        assert (f.getframerate(), f.getnchannels(), f.getsampwidth(), f.getnframes()) == (
            16000,
            1,
            2,
            8000,
        )
    assert prompt_wav(3) != prompt_wav(4)
