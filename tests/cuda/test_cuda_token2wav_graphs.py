"""token2wav's DiT evaluations replayed as CUDA graphs (stages/qwen2_5_omni/token2wav_graphs.py)
on a GPU, float32 with TF32 off: streamed chunks equal the eager ones on the same GPU, the
shapes are captured once and replayed after, and a streaming engine on the GPU turns them on by
default. The per-chunk time, eager and replayed, is printed (not asserted; bench/gpu.py
measures the pipeline)."""

from __future__ import annotations

import time

import pytest
import torch

from omni.engine import GenerationEngine
from stages.qwen2_5_omni.token2wav import OmniToken2WavAdapter
from tests.integration.test_token2wav_graphs import (
    assert_chunks_close,
    jobs_of,
    stream,
    token2wav_stage,
)
from tests.integration.test_token2wav_precision import BOUNDS, difference
from tests.integration.test_token2wav_stream import amplify_dit, random_codes

pytestmark = [pytest.mark.cuda, pytest.mark.slow]

CUDA = torch.device("cuda", 0)


def timed_chunks(adapter: OmniToken2WavAdapter, jobs) -> tuple[list[torch.Tensor], float]:
    torch.cuda.synchronize(CUDA)
    start = time.perf_counter()
    chunks = adapter.decode_chunks(jobs)
    torch.cuda.synchronize(CUDA)
    return chunks, time.perf_counter() - start


def test_replayed_chunks_equal_eager_on_the_gpu(omni_dir):
    eager = amplify_dit(OmniToken2WavAdapter(omni_dir, device=CUDA))
    graphed = amplify_dit(OmniToken2WavAdapter(omni_dir, device=CUDA))
    graphed.enable_cuda_graphs(4)
    graphs = graphed.chunk_graphs
    assert graphs is not None
    codes = random_codes(60, seed=1)
    want, _ = timed_chunks(eager, jobs_of(codes))  # warms the eager kernels too
    got, capture_s = timed_chunks(graphed, jobs_of(codes))
    assert_chunks_close(got, want)
    assert (graphs.num_captures, graphs.num_graphs) == (2, 2)
    assert (graphs.num_vocoder_captures, graphs.failure) == (1, None)  # BigVGAN replayed too
    other = random_codes(60, seed=2)
    want, eager_s = timed_chunks(eager, jobs_of(other))
    got, replay_s = timed_chunks(graphed, jobs_of(other))
    assert_chunks_close(got, want)
    assert graphs.num_captures == 2  # replayed, not captured again
    print(
        f"\n4 chunks, two ODE schedules: eager {eager_s * 1e3:.1f} ms, replayed "
        f"{replay_s * 1e3:.1f} ms (first call, capturing: {capture_s * 1e3:.1f} ms)"
    )


def test_a_streaming_engine_on_the_gpu_replays_by_default(omni_dir):
    """cuda_graphs null on a GPU: replayed, float32 chunks (stream.dtype float32) equal eager."""
    adapter = amplify_dit(OmniToken2WavAdapter(omni_dir, device=CUDA))
    stage = GenerationEngine(token2wav_stage(omni_dir, None, dtype="float32"), model=adapter)
    assert stage.cuda_graphs
    eager = amplify_dit(OmniToken2WavAdapter(omni_dir, device=CUDA))
    codes = random_codes(30, seed=4)
    audio = stream(stage, codes)
    config = token2wav_stage(omni_dir, False, dtype="float32")
    want = stream(GenerationEngine(config, model=eager), codes)
    assert audio.device.type == "cpu"
    torch.testing.assert_close(audio, want, atol=1e-4, rtol=0)
    assert stage.stats()["graph_replays"] > 0


def test_float16_chunks_by_default_on_the_gpu_within_their_bound(omni_dir):
    """stream.dtype null on a GPU is float16: replayed chunks within the bound the CPU measures
    (tests/integration/test_token2wav_precision.py) of float32 ones; the time of each printed."""
    engines = {}
    for dtype in (None, "float32"):
        adapter = amplify_dit(OmniToken2WavAdapter(omni_dir, device=CUDA))
        engines[dtype] = GenerationEngine(
            token2wav_stage(omni_dir, None, dtype=dtype), model=adapter
        )
    assert engines[None].chunk_dtype == torch.float16
    codes = random_codes(60, seed=1)
    timings = {}
    for dtype, engine in engines.items():
        stream(engine, codes)  # captures
        torch.cuda.synchronize(CUDA)
        start = time.perf_counter()
        audio = stream(engine, codes)
        timings[dtype] = (time.perf_counter() - start, audio)
    max_abs, snr = difference([timings[None][1]], [timings["float32"][1]])
    print(
        f"\nstreamed 60 codes: float16 {timings[None][0] * 1e3:.1f} ms, float32 "
        f"{timings['float32'][0] * 1e3:.1f} ms; max abs {max_abs:.2e}, SNR {snr:.1f} dB"
    )
    bound_abs, bound_snr = BOUNDS[torch.float16]
    assert max_abs <= bound_abs and snr >= bound_snr
    assert engines[None].model.num_float32_retries == 0


def test_rk4_without_syncs_equals_transformers_on_the_gpu():
    """integrate_rk4 with its steps queued (at most QUEUED_STEPS, waited on by events) gives
    transformers' RungeKutta4ODESolver result bit for bit on the GPU, in float32."""
    from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import RungeKutta4ODESolver

    from stages.qwen2_5_omni.token2wav_ode import integrate_rk4
    from tests.unit.test_token2wav_rk4 import schedule, velocity

    device = torch.device("cuda", 0)
    initial = torch.randn(4, 96, 80, generator=torch.Generator().manual_seed(1)).to(device)
    times = schedule(10, -1.0).to(device)
    expected = RungeKutta4ODESolver(velocity, initial).integrate(times)[-1]
    assert torch.equal(integrate_rk4(velocity, initial, times, 10, -1.0), expected)
