"""The tiny Qwen2.5-Omni pipeline with every stage on the GPU (local backend): under
`runtime.stage_threads: auto` each stage steps on a thread of its own and launches on a CUDA
stream of its own (`runtime.stage_streams` null), and the float32 thinker tokens, talker codes
and audio equal the one-thread (`shared`) run on the default stream, streaming included; so do
own threads on one stream. The wall time of each run is printed (the tiny model is
launch-bound: overlap shows there)."""

from __future__ import annotations

import time

import pytest
import torch

from omni import Omni
from omni.core.sampling_params import SamplingParams

pytestmark = [pytest.mark.cuda, pytest.mark.slow]

STAGES = ("thinker", "talker", "token2wav")
PROMPTS = [{"prompt": f"tell me about the sea, part {i}"} for i in range(6)]
PARAMS = [
    SamplingParams(max_tokens=8, ignore_eos=True),
    SamplingParams(max_tokens=60, ignore_eos=True, stop_token_ids=(8292, 8294)),
    SamplingParams(max_tokens=1, seed=0),
]


def run(omni_dir: str, stage_threads: str, stage_streams: bool | None = None):
    overrides: dict = {f"stages.{stage}.engine.device": "cuda" for stage in STAGES}
    for stage in ("thinker", "talker"):
        overrides[f"stages.{stage}.engine.dtype"] = "float32"
    # float16 chunks (the GPU default) round differently in each run's batches of chunks.
    overrides["stages.token2wav.stream.dtype"] = "float32"
    runtime = {"backend": "local", "stage_threads": stage_threads, "stage_streams": stage_streams}
    with Omni(model=omni_dir, runtime=runtime, **overrides) as omni:
        own = {name: host.threaded for name, host in omni.backend.hosts.items()}
        omni.generate(PROMPTS[:1], PARAMS, use_tqdm=False)  # warm-up (Triton compiles)
        start = time.perf_counter()
        outputs = omni.generate(PROMPTS, PARAMS, use_tqdm=False, stream_audio=True)
        seconds = time.perf_counter() - start
        threads = [h._thread for h in omni.backend.hosts.values() if h._thread]
        streams = {name: h.stream is not None for name, h in omni.backend.hosts.items()}
        priorities = {n: h.stream.priority for n, h in omni.backend.hosts.items() if h.stream}
    assert not any(thread.is_alive() for thread in threads)
    if priorities:  # the ar stages' kernels go first whenever SMs free up (omni/engine/device.py)
        assert priorities["thinker"] == priorities["talker"] < priorities["token2wav"] == 0
    assert streams == dict.fromkeys(
        STAGES, stage_threads != "shared" and stage_streams is not False
    )
    return own, outputs, seconds


def test_gpu_stages_on_their_own_threads_equal_one_thread(omni_dir):
    own_shared, shared, shared_s = run(omni_dir, "shared")
    own_auto, auto, auto_s = run(omni_dir, "auto")
    _, one_stream, one_stream_s = run(omni_dir, "auto", stage_streams=False)
    print(
        f"\n[{len(PROMPTS)} requests] shared thread {shared_s:.2f} s, own threads and streams "
        f"{auto_s:.2f} s, own threads on one stream {one_stream_s:.2f} s"
    )
    assert own_shared == dict.fromkeys(STAGES, False) and own_auto == dict.fromkeys(STAGES, True)
    for a, b in [*zip(shared, auto, strict=True), *zip(shared, one_stream, strict=True)]:
        assert a.error is None and b.error is None, (a.error, b.error)
        for stage in ("thinker", "talker"):
            assert a.stages[stage].token_ids == b.stages[stage].token_ids, stage
        assert a.final.audio.shape == b.final.audio.shape and a.final.audio.numel() > 0
        torch.testing.assert_close(a.final.audio, b.final.audio, atol=1e-4, rtol=1e-3)


def test_urgent_stream_outranks_the_stage_streams_and_orders_work():
    """A step holding a first chunk launches on the urgent stream, after the thread's queued
    work, and the thread's stream waits for it (omni/engine/device.py: urgent_stream)."""
    from omni.engine.device import stream_priority, urgent_stream, use_own_stream

    device = torch.device("cuda", 0)
    own = use_own_stream(device, stream_priority("generation"))
    try:
        x = torch.zeros(1 << 20, device=device)
        torch.cuda._sleep(10_000_000)  # queued work the urgent block must come after
        x += 1
        with urgent_stream(device, True):
            urgent = torch.cuda.current_stream(device)
            assert urgent != own and urgent.priority < stream_priority("ar") <= own.priority
            x *= 3
        assert torch.cuda.current_stream(device) == own
        x -= 1  # on the thread's stream again: after the urgent block
        assert torch.equal(x, torch.full_like(x, 2.0))
    finally:
        torch.cuda.set_stream(torch.cuda.default_stream(device))
