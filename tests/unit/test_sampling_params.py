"""SamplingParams validation (a ValueError naming the field and the value) and the
sampling_params argument of the engine."""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import numpy as np
import pytest

from omni.core.sampling_params import GREEDY_BELOW, SamplingParams
from omni.entrypoints.async_omni import AsyncOmni

BAD = [
    # bools are never integers
    (
        {"max_tokens": True},
        "SamplingParams.max_tokens must be an integer >= 1 or None, got True (bool)",
    ),
    ({"seed": True}, "SamplingParams.seed must be an integer or None, got True (bool)"),
    ({"seed": False}, "SamplingParams.seed must be an integer or None, got False (bool)"),
    ({"top_k": True}, "SamplingParams.top_k must be an integer >= 0, got True (bool)"),
    # strings and floats are not integers
    (
        {"max_tokens": "8"},
        "SamplingParams.max_tokens must be an integer >= 1 or None, got '8' (str)",
    ),
    (
        {"max_tokens": 8.0},
        "SamplingParams.max_tokens must be an integer >= 1 or None, got 8.0 (float)",
    ),
    ({"max_tokens": 0}, "SamplingParams.max_tokens must be an integer >= 1 or None, got 0 (int)"),
    ({"top_k": -1}, "SamplingParams.top_k must be an integer >= 0, got -1 (int)"),
    ({"seed": "7"}, "SamplingParams.seed must be an integer or None, got '7' (str)"),
    (
        {"max_tokens": np.array([1, 2])},
        "SamplingParams.max_tokens must be an integer >= 1 or None, got array([1, 2]) (ndarray)",
    ),
    # strings are not numbers (a raw TypeError from `'0.8' >= 0` before)
    (
        {"temperature": "0.8"},
        "SamplingParams.temperature must be a finite number >= 0, got '0.8' (str)",
    ),
    ({"top_p": "0.9"}, "SamplingParams.top_p must be a finite number in (0, 1], got '0.9' (str)"),
    (
        {"temperature": True},
        "SamplingParams.temperature must be a finite number >= 0, got True (bool)",
    ),
    ({"temperature": None}, "SamplingParams.temperature must be a finite number >= 0, got None"),
    # non-finite and out of range
    (
        {"temperature": math.inf},
        "SamplingParams.temperature must be a finite number >= 0, got inf (float)",
    ),
    (
        {"temperature": math.nan},
        "SamplingParams.temperature must be a finite number >= 0, got nan (float)",
    ),
    (
        {"temperature": -0.5},
        "SamplingParams.temperature must be a finite number >= 0, got -0.5 (float)",
    ),
    ({"top_p": math.nan}, "SamplingParams.top_p must be a finite number in (0, 1], got nan"),
    ({"top_p": 0}, "SamplingParams.top_p must be a finite number in (0, 1], got 0 (int)"),
    ({"top_p": 1.5}, "SamplingParams.top_p must be a finite number in (0, 1], got 1.5 (float)"),
    # stop_token_ids: a list or tuple of non-negative integers
    (
        {"stop_token_ids": None},
        "SamplingParams.stop_token_ids must be a list of non-negative integer token ids, "
        "got None (NoneType)",
    ),
    (
        {"stop_token_ids": 5},
        "SamplingParams.stop_token_ids must be a list of non-negative integer token ids, "
        "got 5 (int)",
    ),
    (
        {"stop_token_ids": "12"},
        "SamplingParams.stop_token_ids must be a list of non-negative integer token ids, "
        "got '12' (str)",
    ),
    (
        {"stop_token_ids": [3, True]},
        "SamplingParams.stop_token_ids must be a list of non-negative integer token ids, "
        "got [3, True]: item 1 is True (bool)",
    ),
    (
        {"stop_token_ids": [3, 4, -1]},
        "SamplingParams.stop_token_ids must be a list of non-negative integer token ids, "
        "got [3, 4, -1]: item 2 is -1 (int)",
    ),
    (
        {"stop_token_ids": ("7",)},
        "SamplingParams.stop_token_ids must be a list of non-negative integer token ids, "
        "got ('7',): item 0 is '7' (str)",
    ),
    (
        {"stop_token_ids": [2.0]},
        "SamplingParams.stop_token_ids must be a list of non-negative integer token ids, "
        "got [2.0]: item 0 is 2.0 (float)",
    ),
    # ignore_eos: a bool only
    ({"ignore_eos": 1}, "SamplingParams.ignore_eos must be True or False, got 1 (int)"),
    ({"ignore_eos": "no"}, "SamplingParams.ignore_eos must be True or False, got 'no' (str)"),
    ({"ignore_eos": None}, "SamplingParams.ignore_eos must be True or False, got None"),
    (
        {"include_stop_str_in_output": 1},
        "SamplingParams.include_stop_str_in_output must be True or False, got 1 (int)",
    ),
]


@pytest.mark.parametrize(("kwargs", "message"), BAD, ids=[repr(k) for k, _ in BAD])
def test_bad_values_raise_value_error_naming_field_and_value(kwargs, message):
    with pytest.raises(ValueError) as info:
        SamplingParams(**kwargs)
    assert str(info.value).startswith(message), str(info.value)


@pytest.mark.parametrize(("kwargs", "message"), BAD[:6], ids=[repr(k) for k, _ in BAD[:6]])
def test_replace_validates_too(kwargs, message):
    with pytest.raises(ValueError, match="^SamplingParams\\."):
        dataclasses.replace(SamplingParams(), **kwargs)


def test_good_values_are_accepted_and_normalized():
    params = SamplingParams(
        max_tokens=np.int64(5),
        temperature=1,
        top_p=np.float32(0.5),
        top_k=np.int32(3),
        seed=-7,
        stop_token_ids=[np.int64(4), 9],
        ignore_eos=True,
    )
    assert params == SamplingParams(5, 1.0, 0.5, 3, -7, (4, 9), True)
    assert type(params.max_tokens) is int and type(params.top_k) is int
    assert type(params.temperature) is float and type(params.top_p) is float
    assert params.stop_token_ids == (4, 9) and all(type(t) is int for t in params.stop_token_ids)
    assert SamplingParams(top_p=1).top_p == 1.0
    assert SamplingParams(max_tokens=None).max_tokens is None  # until the end of the context
    assert SamplingParams(stop_token_ids=()).stop_token_ids == ()
    hash(params)  # still hashable (frozen, normalized to a tuple)


def test_tiny_temperatures_are_greedy():
    assert SamplingParams().greedy and SamplingParams(temperature=0).greedy
    assert SamplingParams(temperature=1e-40).greedy
    assert SamplingParams(temperature=GREEDY_BELOW / 2).greedy
    assert GREEDY_BELOW == 1e-5
    assert not SamplingParams(temperature=GREEDY_BELOW).greedy
    assert not SamplingParams(temperature=0.7).greedy
    # The value given is kept (only its effect is greedy).
    assert SamplingParams(temperature=1e-40).temperature == 1e-40


# ---- the sampling_params argument of generate ----------------------------------------------------
ADAPTERS = {"thinker": "qwen2_5_omni_thinker", "talker": "qwen2_5_omni_talker",
            "code2wav": "qwen2_5_omni_token2wav"}  # fmt: skip


def _engine(*names: str) -> SimpleNamespace:
    stages = [
        SimpleNamespace(name=n, sampling=SamplingParams(max_tokens=i + 1), adapter=ADAPTERS[n])
        for i, n in enumerate(names)
    ]
    by_name = {s.name: s for s in stages}
    return SimpleNamespace(config=SimpleNamespace(stages=stages, stage=by_name.__getitem__))


PER_STAGE = (
    "sampling_params must be one SamplingParams or a list of 3 "
    "(one per stage: ['thinker', 'talker', 'code2wav'])"
)


@pytest.mark.parametrize(
    ("value", "got"),
    [
        ("greedy", "got 'greedy' (str)"),
        (b"greedy", "got b'greedy' (bytes)"),
        ({"thinker": SamplingParams()}, "got {'thinker': SamplingParams("),
        (0.5, "got 0.5 (float)"),
        ([SamplingParams()], "got a list of 1"),
        ((SamplingParams(),) * 4, "got a tuple of 4"),
        ([SamplingParams(), "greedy", SamplingParams()], "got 'greedy' (str) at index 1"),
        ("x" * 200, "got '" + "x" * 76 + "... (str)"),
    ],
)
def test_bad_sampling_params_argument(value, got):
    engine = _engine("thinker", "talker", "code2wav")
    with pytest.raises(ValueError) as info:
        AsyncOmni.stage_params(engine, value)
    message = str(info.value)
    assert message.startswith(f"{PER_STAGE}, got"), message
    assert got in message, message
    assert "'g', 'r'" not in message  # a string is never spelled out letter by letter


def test_sampling_params_argument_forms():
    engine = _engine("thinker", "talker", "code2wav")
    defaults = AsyncOmni.stage_params(engine, None)
    assert [p.max_tokens for p in defaults.values()] == [1, 2, 3]
    one = SamplingParams(max_tokens=9)
    assert AsyncOmni.stage_params(engine, one) == dict.fromkeys(defaults, one)
    per_stage = (SamplingParams(max_tokens=4), one, SamplingParams())
    got = AsyncOmni.stage_params(engine, per_stage)
    assert list(got.values()) == list(per_stage) and list(got) == list(defaults)


def test_a_json_schema_constrains_the_text_stages_only():
    engine = _engine("thinker", "talker", "code2wav")
    one = SamplingParams(max_tokens=9, json_schema={"type": "object"})
    got = AsyncOmni.stage_params(engine, one)
    assert got["thinker"] == one  # one for all: the stages that make codes or audio go without
    assert got["talker"] == got["code2wav"] == dataclasses.replace(one, json_schema=None)
    with pytest.raises(
        ValueError, match=r"sampling_params\[1\].json_schema: stage 'talker' makes no text"
    ):
        AsyncOmni.stage_params(engine, [SamplingParams(), one, SamplingParams()])
