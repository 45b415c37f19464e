"""AsyncOmni: many concurrent callers on one always-on Qwen2.5-Omni pipeline (tiny random weights).

The reference is the same pipeline serving the same prompts one at a time (`Omni.generate` with a
single prompt): concurrency and continuous batching must not change any request's thinker tokens,
talker codes or waveform, and every request streams snapshots whose token lists are prefixes of
its final ones.
"""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest
import torch
from helpers import OMNI_ON_CPU
from PIL import Image

from omni import AsyncOmni, Omni
from omni.core.sampling_params import SamplingParams

pytestmark = pytest.mark.slow

PARAMS = [
    SamplingParams(max_tokens=6, ignore_eos=True),
    SamplingParams(max_tokens=12, stop_token_ids=(8292, 8294)),
    SamplingParams(max_tokens=1, seed=3),
]
# Long enough to be caught mid-generation in the talker.
LONG = [
    SamplingParams(max_tokens=8, ignore_eos=True),
    SamplingParams(max_tokens=400, ignore_eos=True),
    SamplingParams(max_tokens=1, seed=3),
]
SHARED = "You are a helpful assistant. Answer in one short sentence, please. "
CPU = {"runtime": {"backend": "local"}, **OMNI_ON_CPU}  # every run compared with `sequential`


def _prompts(num_prompts: int = 64) -> list:
    """Text prompts of varied lengths, half sharing a prefix (prefix hits under concurrency),
    and every eighth with an image."""
    image = Image.fromarray(np.random.default_rng(1).integers(0, 256, (56, 56, 3), dtype=np.uint8))
    prompts: list = []
    for i in range(num_prompts):
        text = (SHARED if i % 2 else "") + f"question {i}: " + "tell me more " * (i % 5 + 1)
        prompts.append({"prompt": text, "images": [image]} if i % 8 == 7 else text)
    return prompts


@pytest.fixture(scope="module")
def sequential(omni_dir):
    """Each prompt alone through its own call: the reference for every concurrent run."""
    with Omni(model=omni_dir, **CPU) as omni:
        return [omni.generate([p], PARAMS, use_tqdm=False)[0] for p in _prompts()]


def _assert_same(got, want, where: str) -> None:
    assert got.error is None, f"{where}: {got.error}"
    for stage in ("thinker", "talker"):
        assert got.stages[stage].token_ids == want.stages[stage].token_ids, (where, stage)
    assert got.stages["thinker"].text == want.stages["thinker"].text, where
    torch.testing.assert_close(got.final.audio, want.final.audio, atol=1e-5, rtol=0)


def _assert_snapshots(snapshots: list, where: str) -> None:
    final = snapshots[-1]
    assert final.finished and not any(s.finished for s in snapshots[:-1]), where
    assert len(snapshots) > 1, f"{where}: only the final snapshot"
    for snapshot in snapshots:
        for stage, partial in snapshot.stages.items():
            done = final.stages[stage].token_ids
            assert partial.token_ids == done[: len(partial.token_ids)], (where, stage)
    counts = [len(s.stages.get("thinker", s.final).token_ids) for s in snapshots]
    assert counts == sorted(counts), f"{where}: thinker tokens went backwards: {counts}"


async def _settled(engine: AsyncOmni, timeout_s: float = 15.0) -> dict:
    """Stats once no request is left anywhere: hosts apply aborts between steps."""
    deadline = time.monotonic() + timeout_s
    while True:
        stats = engine.stats()
        busy = any(s.get("num_requests") or s.get("kv_blocks_in_use") for s in stats.values())
        if not (busy or engine.num_requests) or time.monotonic() > deadline:
            return stats
        await asyncio.sleep(0.1)


async def _concurrent(engine: AsyncOmni, prompts: list) -> list[list]:
    async def one(i: int, prompt) -> list:
        return [
            out
            async for out in engine.generate(prompt, PARAMS, request_id=f"c{i}", stream_audio=True)
        ]

    return list(await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts))))


@pytest.mark.parametrize("backend", ["local", pytest.param("ray", marks=pytest.mark.ray)])
def test_64_concurrent_callers_equal_sequential_runs(request, omni_dir, sequential, backend):
    if backend == "ray":
        request.getfixturevalue("ray_cluster")  # the session's cluster, connected

    async def main():
        async with AsyncOmni(model=omni_dir, runtime={"backend": backend}, **OMNI_ON_CPU) as engine:
            snapshots = await _concurrent(engine, _prompts())
            return snapshots, engine.stats()

    snapshots, stats = asyncio.run(main())
    for i, (snaps, want) in enumerate(zip(snapshots, sequential, strict=True)):
        _assert_snapshots(snaps, f"request {i}")
        _assert_same(snaps[-1], want, f"request {i}")
        timings = snaps[-1].final.timings
        thinker = snaps[-1].stages["thinker"].timings
        assert 0 < thinker["first_token_s"] <= thinker["finished_s"] <= timings["first_audio_s"]
        for stage in ("thinker", "talker"):  # routed there, then its tokens
            stage_timings = snaps[-1].stages[stage].timings
            assert 0 <= stage_timings["started_s"] <= stage_timings["first_token_s"], stage
        assert thinker["started_s"] <= snaps[-1].stages["talker"].timings["started_s"]
        assert 0 < timings["started_s"] <= timings["first_audio_s"]
        assert timings["rtf"] > 0
    assert stats["token2wav"]["rtf"] > 0 and stats["token2wav"]["audio_s"] > 0
    # Continuous batching: far fewer thinker steps than requests x tokens.
    assert stats["thinker"]["steps"] < len(sequential) * PARAMS[0].max_tokens / 4
    assert stats["thinker"]["kv_hit_tokens"] > 0  # the shared prefix, across concurrent callers
    for stage in ("thinker", "talker", "token2wav"):
        assert stats[stage]["num_requests"] == 0


def test_two_threads_share_one_omni(omni_dir, sequential):
    prompts = _prompts()
    results: dict[int, list] = {}
    with Omni(model=omni_dir, **CPU) as omni:

        def call(k: int) -> None:
            results[k] = omni.generate(prompts[k * 8 : (k + 1) * 8], PARAMS, use_tqdm=False)

        threads = [threading.Thread(target=call, args=(k,)) for k in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
    assert sorted(results) == [0, 1]
    for k in (0, 1):
        for j, output in enumerate(results[k]):
            _assert_same(output, sequential[k * 8 + j], f"thread {k}, prompt {j}")


def test_cancel_and_early_exit_free_every_stage(omni_dir, sequential):
    prompts = _prompts(8)

    async def main():
        async with AsyncOmni(model=omni_dir, **CPU) as engine:

            async def keep(i: int):
                return [
                    out async for out in engine.generate(prompts[i], PARAMS, stream_audio=True)
                ][-1]

            async def leave_in_talker(i: int) -> None:
                async for out in engine.generate(prompts[i], LONG, stream_audio=True):
                    if len(out.stages.get("talker", out.final).token_ids) >= 3:
                        break  # leaving the loop aborts the request

            async def run_long(i: int, started: asyncio.Event):
                async for out in engine.generate(
                    prompts[i], LONG, request_id=f"long{i}", stream_audio=True
                ):
                    if "talker" in out.stages:
                        started.set()
                return out

            started = [asyncio.Event(), asyncio.Event()]
            cancelled = asyncio.create_task(run_long(2, started[0]))
            aborted = asyncio.create_task(run_long(3, started[1]))
            kept = [asyncio.create_task(keep(i)) for i in (0, 1, 4, 5)]
            early = [asyncio.create_task(leave_in_talker(i)) for i in (6, 7)]
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), 60)
            cancelled.cancel()
            assert await engine.abort("long3")
            await asyncio.gather(*early)
            outputs = await asyncio.gather(*kept)
            last = await asyncio.wait_for(aborted, 10)
            assert last.finished and last.final.finish_reason == "aborted"
            assert last.error == "request 'long3' was aborted"
            with pytest.raises(asyncio.CancelledError):
                await cancelled
            return outputs, await _settled(engine)

    outputs, stats = asyncio.run(main())
    for i, output in zip((0, 1, 4, 5), outputs, strict=True):
        _assert_same(output, sequential[i], f"kept request {i}")
    for stage in ("thinker", "talker"):
        assert stats[stage]["kv_blocks_in_use"] == 0, stats[stage]
    for stage in ("thinker", "talker", "token2wav"):
        assert stats[stage]["num_requests"] == 0, stats[stage]


def test_bad_requests_and_health(omni_dir):
    async def main():
        engine = AsyncOmni(model=omni_dir, **CPU)
        try:
            await engine.check_health()
            with pytest.raises(ValueError, match="unknown key"):
                async for _ in engine.generate({"prompt": "hi", "voice": "x"}):
                    pass
            with pytest.raises(ValueError, match="one SamplingParams or a list of 3"):
                async for _ in engine.generate("hi", [SamplingParams()]):
                    pass
            first = engine.generate("a first request", LONG, request_id="same")
            await first.__anext__()
            with pytest.raises(ValueError, match="request_id 'same' is already running"):
                async for _ in engine.generate("a second one", request_id="same"):
                    pass
            await first.aclose()  # aborts "same": the id is free again
            again = [out async for out in engine.generate("again", PARAMS, request_id="same")]
            assert again[-1].finished and again[-1].error is None
            assert {r.request_id for r in again[-1].stages.values()} == {"same"}
        finally:
            engine.shutdown()
        with pytest.raises(RuntimeError, match="shut down"):
            async for _ in engine.generate("too late"):
                pass
        with pytest.raises(RuntimeError, match="shut down"):
            await engine.check_health()

    asyncio.run(main())


def test_text_only_requests_and_voices(omni_dir, sequential):
    prompt = _prompts()[0]

    async def main():
        async with AsyncOmni(model=omni_dir, **CPU) as engine:
            assert (engine.text_stage, engine.audio_stage) == ("thinker", "token2wav")
            assert engine.voices == ["Chelsie", "Ethan"]
            text_only = [
                out async for out in engine.generate(prompt, PARAMS, final_stage=engine.text_stage)
            ][-1]
            untouched = engine.stats()
            voiced = {}
            for voice in engine.voices:
                spoken = {"prompt": prompt, "speaker": voice}
                voiced[voice] = [
                    out async for out in engine.generate(spoken, PARAMS, stream_audio=True)
                ][-1]
            with pytest.raises(ValueError, match=r"speaker 'Bob' is not a voice.*'Chelsie'"):
                async for _ in engine.generate({"prompt": prompt, "speaker": "Bob"}):
                    pass
            with pytest.raises(ValueError, match="final_stage 'vocoder' is not a stage"):
                async for _ in engine.generate(prompt, final_stage="vocoder"):
                    pass
            return text_only, untouched, voiced

    text_only, untouched, voiced = asyncio.run(main())
    assert text_only.finished and list(text_only.stages) == ["thinker"]
    assert text_only.final.token_ids == sequential[0].stages["thinker"].token_ids
    assert untouched["talker"]["steps"] == 0 and untouched["token2wav"]["steps"] == 0
    _assert_same(voiced["Chelsie"], sequential[0], "the default voice")  # Chelsie is the default
    ethan = voiced["Ethan"]
    assert ethan.stages["thinker"].token_ids == sequential[0].stages["thinker"].token_ids
    assert not torch.equal(ethan.final.audio[:100], voiced["Chelsie"].final.audio[:100])
