"""SamplingParams.stop (omni/driver/stop_strings.py): stop strings matched on the final stage's
decoded text, through the real driver (AsyncOmni, local backend, the tiny Qwen2). The reference
is the same request without stop strings: with a stop string cut out of the middle of its text
(spanning tokens), the result is its tokens up to the one that completed the string and its text
before it; streamed snapshots never show any part of the string; and a stage that may not take
stop strings is refused before any work starts."""

from __future__ import annotations

import asyncio

import pytest
from helpers import on_cpu
from two_stage_support import two_stage_config

from omni import AsyncOmni
from omni.core.sampling_params import SamplingParams
from omni.driver.stop_strings import StopStrings

MAX_TOKENS = 24
PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def lm(qwen2_dir):
    engine = AsyncOmni(model=qwen2_dir, runtime={"backend": "local"}, **on_cpu("llm"))
    yield engine
    engine.shutdown()


async def _run(engine: AsyncOmni, params: SamplingParams):
    snapshots = [out async for out in engine.generate(PROMPT, params)]
    return snapshots[-1].final, [s.final.text or "" for s in snapshots[:-1]]


def test_a_stop_string_spanning_tokens_cuts_the_result_where_it_starts(lm):
    plain = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
    reference, _ = asyncio.run(_run(lm, plain))
    text, tokens = reference.text, reference.token_ids
    decode = lm.driver.router.decode
    lengths = [len(decode("llm", tokens[:n]) or "") for n in range(len(tokens) + 1)]
    # From the middle of token 5's text to the middle of token 8's.
    start, end = (lengths[4] + lengths[5]) // 2, (lengths[7] + lengths[8]) // 2 + 1
    stop = text[start:end]
    assert len(stop) >= 2 and text.find(stop) == start
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, stop=("never there", stop))
    result, streamed = asyncio.run(_run(lm, params))
    num_tokens = next(n for n in range(len(tokens) + 1) if lengths[n] >= end)
    assert result.finish_reason == "stopped" and result.text == text[:start]
    assert result.token_ids == tokens[:num_tokens]
    # Streamed text (snapshots a slow reader gets coalesce: how many varies) only grows, stays a
    # prefix of the result, never shows part of the string.
    for before, after in zip(streamed, streamed[1:], strict=False):
        assert after.startswith(before)
    assert all(result.text.startswith(piece) for piece in streamed)


def test_a_stop_string_inside_one_token_and_one_never_met(lm):
    plain = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
    reference, _ = asyncio.run(_run(lm, plain))
    text = reference.text
    decode = lm.driver.router.decode
    token_text = decode("llm", reference.token_ids[3:4]) or ""
    stop = next(token_text[i:] for i in range(len(token_text)) if token_text[i:].strip())
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, stop=stop)
    result, _ = asyncio.run(_run(lm, params))
    assert result.finish_reason == "stopped" and result.text == text[: text.find(stop)]
    assert len(result.token_ids) <= 4
    never = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, stop="\x00never\x00")
    unchanged, _ = asyncio.run(_run(lm, never))
    assert unchanged.token_ids == reference.token_ids and unchanged.finish_reason == "length"


def test_stop_strings_on_a_stage_that_is_not_the_final_one_are_refused(qwen2_dir, llama_dir):
    config = two_stage_config(qwen2_dir, llama_dir, **{"runtime.backend": "local"})
    engine = AsyncOmni(config)
    try:
        both = SamplingParams(max_tokens=4, stop="x")
        with pytest.raises(ValueError, match=r"SamplingParams.stop of stage 'a'.*final stage"):
            asyncio.run(_run_ids(engine, [both, both]))
        # Ending at stage a, a's stop strings are its final stage's.
        out = asyncio.run(_run_ids(engine, [both, SamplingParams(max_tokens=4)], final_stage="a"))
        assert out.finish_reason in ("stopped", "length") and engine.num_requests == 0
    finally:
        engine.shutdown()


async def _run_ids(engine: AsyncOmni, params: list[SamplingParams], final_stage: str | None = None):
    snapshots = [o async for o in engine.generate([5, 6, 7, 8], params, final_stage=final_stage)]
    return snapshots[-1].final


def test_held_back_text_and_the_search_window():
    stops = StopStrings(("abc", "xy"))
    assert stops.held_back("hello ab") == "hello " and stops.held_back("hello x") == "hello "
    assert stops.held_back("hello abd") == "hello abd" and stops.held_back("") == ""
    assert stops.find("zzzza") is None and stops.find("zzzzabc") == (4, 7)
    later = StopStrings(("abc",))
    assert later.find("ab") is None and later.find("ab" + "c" * 3) == (0, 3)
