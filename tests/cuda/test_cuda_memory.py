"""GPU memory and failure on a real GPU: a stage's KV pool sized from its own footprint while
the process holds other memory (review finding 2), the thinker's largest-item profile, the
token2wav whole-decode estimate against the measured peak and the windowed path's bounded one
(finding 24), and a real device-side assert ending a stage of a local pipeline (finding 25).

Every test needs a GPU (`cuda` marker: skipped where torch sees none). The device-side assert
poisons its process's CUDA context, so that test runs its pipeline in a child process."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from helpers import make_engine, run_engine

from omni.config import load_config
from omni.core.sampling_params import SamplingParams
from omni.engine import StageEngine
from omni.engine.gpu_profile import profile_stage
from omni.engine.graph_plan import trial_capture
from omni.messages import StageInput
from stages.qwen2_5_omni.token2wav import OmniToken2WavAdapter
from stages.qwen2_5_omni.token2wav_memory import max_whole_decode_codes, whole_decode_bytes

pytestmark = [pytest.mark.cuda, pytest.mark.slow]

CUDA = torch.device("cuda", 0)
REPO = Path(__file__).resolve().parents[2]


class _Cycle:
    """An object only a reference cycle keeps: freed at the next garbage collection."""

    def __init__(self) -> None:
        self.itself = self
        self.tensor = torch.empty(1 << 20, dtype=torch.uint8, device=CUDA)


def test_garbage_freed_while_a_stage_loads_is_not_in_its_baseline(qwen2_dir):
    """GPU garbage left by earlier work (an earlier test's engine, here a cycle) is collected by
    the profile's readings: counted in the baseline taken before loading, the baseline came out
    above the loaded reading and the engine refused to start (every cuda test after the first
    did on an H200)."""
    gc.disable()
    try:
        _Cycle()
        engine = make_engine(qwen2_dir, device="cuda", block_size=4, num_blocks=64)
        results = run_engine(engine, [[5, 6, 7]], SamplingParams(max_tokens=2, ignore_eos=True))
        assert [len(r.token_ids) for r in results] == [2]
    finally:
        gc.enable()


def test_a_stage_is_sized_from_its_own_footprint(qwen2_dir):
    """40% of the GPU held before the stage loads (standing in for an earlier stage of a local
    pipeline): its 0.1 share still holds a KV pool of nearly 0.1 of the GPU. Measured against
    the process's allocations (before the fix) the peak exceeded the share: a ConfigError.
    (0.1, not more: the tiny model's blocks are small, and the block pool's host bookkeeping
    grows with their number; 0.3 took 52 s on an H200.)"""
    total = torch.cuda.mem_get_info(CUDA)[1]
    held = torch.empty(int(0.4 * total), dtype=torch.uint8, device=CUDA)
    try:
        engine = make_engine(
            qwen2_dir,
            device="cuda",
            dtype="float32",
            outputs=[],  # no output cache: the KV alone fills the share
            block_size=16,
            gpu_memory_utilization=0.1,
            max_model_len=4096,
            max_num_seqs=65536,  # the cap (sequences x max_model_len) stays above the share
            cuda_graphs=False,  # the KV share alone: graphs have a test of their own below
        )
        kv = engine.runner.kv_cache_bytes
        print(f"\nshare 0.1 of {total:,} bytes beside {held.numel():,} held: KV {kv:,} bytes")
        assert 0.08 * total < kv <= 0.1 * total
        greedy = SamplingParams(max_tokens=4, ignore_eos=True)
        results = run_engine(engine, [[5, 6, 7, 8], [9, 10]], greedy)
        assert [len(r.token_ids) for r in results] == [4, 4]
        del engine
    finally:
        del held
        torch.cuda.empty_cache()


def test_cuda_graphs_are_counted_in_the_profile(qwen2_dir):
    """The profile's trial capture (graph_plan.trial_capture) measures what a stage's graphs
    hold: about what the real capture after the pool reserved (its pool, with the scratch
    blocks and static buffers on top), and nothing once dropped."""
    engine = make_engine(
        qwen2_dir, device="cuda", dtype="bfloat16", outputs=[], block_size=16,
        gpu_memory_utilization=0.05, max_model_len=1024, max_num_seqs=64,
    )  # fmt: skip
    graphs = engine.runner.decode_graphs
    assert graphs is not None and graphs.capture_bytes > 0
    trial = trial_capture(engine.config, engine.model, CUDA, engine.max_model_len)
    assert trial is not None
    before = torch.cuda.memory_allocated(CUDA)
    footprint = profile_stage(
        engine.model, block_size=16, num_tokens=1024, num_sample_rows=64, device=CUDA,
        baseline=0, capture=trial,
    )  # fmt: skip
    real = graphs.capture_bytes
    print(f"\ngraphs: trial {footprint.graph_bytes:,} bytes, real capture {real:,}")
    assert 0.5 * real <= footprint.graph_bytes <= 2 * real + (64 << 20)
    assert torch.cuda.memory_allocated(CUDA) <= before + (1 << 20)  # the trial's graphs dropped
    greedy = SamplingParams(max_tokens=4, ignore_eos=True)  # the real graphs still replay
    results = run_engine(engine, [[5, 6, 7, 8], [9, 10]], greedy)
    assert [len(r.token_ids) for r in results] == [4, 4]
    assert engine.stats()["graph_steps"] > 0


def test_local_pipeline_stages_sized_from_their_own_shares(omni_dir):
    """The same end to end: the tiny Qwen2.5-Omni from its shipped config on the local backend,
    thinker and talker pools sized from their shares (num_blocks null) in one process. The
    talker loads after the thinker's weights and pool, which exceed the talker's whole share:
    measured against the process's allocations its peak was over its share (a ConfigError); from
    its own baseline each stage fills its share, up to the pool's cap (max_num_seqs x
    max_model_len tokens). Small shares and no graphs keep the block count and start-up short."""
    from omni import Omni

    shares = {"thinker": 0.05, "talker": 0.015, "token2wav": 0.02}  # the thinker: encoder peaks
    overrides: dict = {f"stages.{s}.resources.gpu_share": v for s, v in shares.items()}
    for stage in ("thinker", "talker"):
        for key, value in (("num_blocks", None), ("max_num_seqs", 1024), ("cuda_graphs", False)):
            overrides[f"stages.{stage}.engine.{key}"] = value
    total = torch.cuda.mem_get_info(CUDA)[1]
    with Omni(model=omni_dir, runtime={"backend": "local"}, **overrides) as omni:
        (out,) = omni.generate([{"prompt": "hello there"}], use_tqdm=False)
        stats = omni.stats()
        engines = {s: omni.backend.hosts[s].engine.config.engine for s in ("thinker", "talker")}
        dit = omni.backend.hosts["token2wav"].engine.model.dit
    assert out.error is None and out.final.audio.numel() > 0
    # The vocoder's whole decode fits in 3/4 of its share (stage_memory.limit_transient_memory),
    # below the 4 GiB default bound (a 0.02 share of this GPU is far less).
    shape = {"repeats": dit.repeats, "num_heads": dit.num_attention_heads}
    whole = stats["token2wav"]["max_whole_codes"]
    print(f"\ntoken2wav: whole decodes up to {whole} codes")
    assert 0 < whole < max_whole_decode_codes(budget_bytes=4 << 30, **shape)
    assert whole_decode_bytes(whole, **shape) <= 0.75 * 0.9 * shares["token2wav"] * total
    for stage in ("thinker", "talker"):
        budget = 0.9 * shares[stage] * total  # a fractional stage uses 0.9 of its share
        kv, blocks, engine = (
            stats[stage]["kv_cache_bytes"],
            stats[stage]["num_blocks"],
            engines[stage],
        )
        cap = engine.max_num_seqs * engine.max_model_len // engine.block_size * (kv // blocks)
        print(f"\n{stage}: share {budget:,.0f} bytes, KV {kv:,} ({blocks:,} blocks), cap {cap:,}")
        assert stats[stage]["device"] == "cuda:0", stage
        assert 0.5 * min(budget, cap) < kv <= budget, stage
    assert stats["thinker"]["memory_allocated_bytes"] > 0.9 * shares["talker"] * total


def test_thinker_sized_with_its_encoders_profiled(omni_dir):
    """The thinker's pool is sized on the GPU after the profile ran its encoders on their
    largest items (nothing cached or counted), with the encoder cache reserved."""
    stage = {"name": "thinker", "model": omni_dir, "adapter": "qwen2_5_omni_thinker"}
    engine = {"device": "cuda", "block_size": 16, "gpu_memory_utilization": 0.2}
    config = load_config({"stages": [{**stage, "engine": engine}]}).stages[0]
    built = StageEngine(config)
    assert built.model.reserved_bytes == 256 << 20 and built.num_blocks > 0
    assert built.model.encoder_runs == {}


def _peak_of(call) -> tuple[int, torch.Tensor]:
    torch.cuda.synchronize(CUDA)
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated(CUDA)
    torch.cuda.reset_peak_memory_stats(CUDA)
    out = call()
    torch.cuda.synchronize(CUDA)
    return torch.cuda.max_memory_allocated(CUDA) - before, out


def test_token2wav_whole_decode_estimate_and_windowed_peak(omni_dir):
    codes = torch.randint(0, 8000, (1500,), generator=torch.Generator().manual_seed(0)).tolist()
    request = StageInput("long", codes)
    whole = OmniToken2WavAdapter(omni_dir, device=CUDA)
    dit = whole.dit
    shape = {"repeats": dit.repeats, "num_heads": dit.num_attention_heads}
    estimate = whole_decode_bytes(len(codes), **shape)
    assert whole.max_whole_codes >= len(codes)
    peak, wav = _peak_of(lambda: whole.generate(request, 0))
    print(f"\nwhole decode of {len(codes)} codes: peak {peak:,} bytes, estimate {estimate:,}")
    assert wav.shape == (len(codes) * whole.samples_per_code,)
    assert estimate / 4 <= peak <= estimate  # the masks dominate, and the estimate bounds them
    bounded = OmniToken2WavAdapter(
        omni_dir, device=CUDA, whole_decode_budget_bytes=whole_decode_bytes(200, **shape)
    )
    windowed_peak, windowed = _peak_of(lambda: bounded.generate(request, 0))
    print(f"windowed: peak {windowed_peak:,} bytes")
    assert windowed.shape == wav.shape and bool(torch.isfinite(windowed).all())
    assert windowed_peak < peak / 4


CHILD = """
import json, sys, time
import torch
from omni import Omni
from omni.config import load_config

repo, a_dir, b_dir = sys.argv[1:4]
overrides = {"runtime.backend": "local", "runtime.log_level": "ERROR"}
for stage in ("a", "b"):
    overrides[f"stages.{stage}.engine.device"] = "cuda"
    overrides[f"stages.{stage}.sampling.max_tokens"] = 4
config = load_config(
    repo + "/stage_configs/tiny_two_stage.yaml", overrides, {"MODEL_A": a_dir, "MODEL_B": b_dir}
)
report = {}
with Omni(config) as omni:
    report["before"] = omni.generate([[5, 6, 7, 8]], use_tqdm=False)[0].error
    model = omni.backend.hosts["b"].engine.model
    forward = model.forward

    def device_assert(inputs):
        out = forward(inputs)
        torch.zeros(4, device="cuda")[torch.tensor([1 << 30], device="cuda")]  # out of bounds
        torch.cuda.synchronize()
        return out

    model.forward = device_assert
    start = time.monotonic()
    report["errors"] = [o.error for o in omni.generate([[5, 6], [7, 8, 9]], use_tqdm=False)]
    report["seconds"] = time.monotonic() - start
    print("REPORT " + json.dumps(report), flush=True)
    try:
        omni.generate([[10, 11]], use_tqdm=False)
    except RuntimeError as e:
        report["refused"] = str(e)
    print("REPORT " + json.dumps(report), flush=True)
report["shut_down"] = True
print("REPORT " + json.dumps(report), flush=True)
"""


def test_a_device_side_assert_ends_the_stage(qwen2_dir, llama_dir):
    child = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(CHILD), str(REPO), qwen2_dir, llama_dir],
        capture_output=True,
        text=True,
        timeout=240,  # never a hang
    )
    lines = [line for line in child.stdout.splitlines() if line.startswith("REPORT ")]
    assert lines, child.stdout[-2000:] + child.stderr[-4000:]
    report = json.loads(lines[-1].removeprefix("REPORT "))
    print(f"\n{report}, exit status {child.returncode}")
    assert report["before"] is None and report["seconds"] < 60
    for error in report["errors"]:
        assert "stage 'b': died of a CUDA error" in error and "device-side assert" in error
    assert "stage 'b': died of a CUDA error" in report["refused"]
    # Not asserted: whether the process then shuts down cleanly. A first run (H200, torch 2.11)
    # saw torch abort it from a tensor's destructor (its allocator could not record a CUDA
    # event on the lost context) before this report was printed; docs/gpu.md says so.
    print(f"shut down cleanly: {bool(report.get('shut_down')) and child.returncode == 0}")
