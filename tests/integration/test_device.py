"""Stage devices on a machine without a GPU: explicit `device: cpu` changes nothing, `device: cuda`
is refused naming the stage before any weights load, engines report device, dtype and memory,
and the output cache's staged copy path (the one a GPU stage takes into pinned host memory) in its
CPU form. The GPU KV sizing on injected numbers: test_gpu_sizing.py.

On a machine with a GPU these tests still run on the CPU: their stages are pinned there, and
where a test is about a machine without one, torch is told it sees no GPU (`no_gpu`). The same
paths on a real GPU are in tests/cuda/ (skipped without one)."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from helpers import (
    OMNI_ON_CPU,
    make_engine,
    run_engine,
    shared_prefix_prompts,
    transformers_greedy,
)
from torch.utils._python_dispatch import TorchDispatchMode

from omni import Omni
from omni.config import ConfigError, load_config
from omni.core.sampling_params import SamplingParams
from omni.engine import GenerationEngine, StageEngine, stage_engine
from omni.engine.device import resolve_device, resolve_dtype
from omni.messages import StageInput
from omni.runtime.output_cache import OutputCache
from stages.qwen2_5_omni.talker_inputs import TalkerRequestState

GREEDY = SamplingParams(max_tokens=8, ignore_eos=True)


@pytest.fixture
def no_gpu(monkeypatch):
    """This process as on a machine without a GPU: torch sees none (auto means the CPU)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def _stage(**engine: object):
    """A stage config without a checkpoint behind it (for the pure functions)."""
    return load_config(
        {"stages": [{"name": "llm", "model": "m", "engine": engine}]}, check_models=False
    ).stages[0]


# ---- device resolution --------------------------------------------------------------------------


def test_resolve_device_and_dtype(monkeypatch):
    assert resolve_device(_stage(device="cpu")) == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device(_stage()) == torch.device("cpu")  # auto without a GPU
    assert resolve_dtype(_stage(), torch.device("cpu")) == torch.float32
    with pytest.raises(ConfigError) as caught:
        resolve_device(_stage(device="cuda"))
    assert str(caught.value).startswith("stage 'llm': stages.llm.engine.device: is cuda, but")
    # Where torch sees a GPU, auto and cuda both mean cuda:0 (Ray narrows what is visible).
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device(_stage()) == torch.device("cuda", 0)
    assert resolve_device(_stage(device="cuda")) == torch.device("cuda", 0)
    assert resolve_device(_stage(device="cpu")) == torch.device("cpu")
    gpu = torch.device("cuda", 0)
    assert resolve_dtype(_stage(), gpu) == torch.bfloat16
    assert resolve_dtype(_stage(dtype="float32"), gpu) == torch.float32
    # A GPU without triton (whose kernel the paged attention runs there): refused, named.
    monkeypatch.setattr("omni.engine.device.HAVE_TRITON", False)
    with pytest.raises(ConfigError, match=r"stages\.llm\.engine\.device: is auto, .*triton"):
        resolve_device(_stage())
    assert resolve_device(_stage(device="cpu")) == torch.device("cpu")


@pytest.mark.usefixtures("no_gpu")
def test_cuda_stage_without_cuda_is_refused_before_loading(qwen2_dir, omni_dir, monkeypatch):
    def no_loading(name):
        raise AssertionError(f"adapter {name!r} loaded although the device is refused")

    monkeypatch.setattr(stage_engine, "get_adapter", no_loading)
    config = load_config(
        {"stages": [{"name": "gpu-llm", "model": qwen2_dir, "engine": {"device": "cuda"}}]}
    )
    with pytest.raises(ConfigError, match=r"stage 'gpu-llm': stages\.gpu-llm\.engine\.device"):
        StageEngine(config.stages[0])
    vocoder = {
        "name": "voice",
        "model": omni_dir,
        "kind": "generation",
        "adapter": "qwen2_5_omni_token2wav",
        "engine": {"device": "cuda"},
    }
    with pytest.raises(ConfigError, match=r"stage 'voice': stages\.voice\.engine\.device"):
        GenerationEngine(load_config({"stages": [vocoder]}).stages[0])


# ---- CPU behaviour and stats ----------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.usefixtures("no_gpu")
def test_explicit_cpu_gives_identical_tokens_and_reports_it(qwen2_dir):
    from transformers import AutoConfig

    prompts = shared_prefix_prompts(AutoConfig.from_pretrained(qwen2_dir).vocab_size, 6, seed=5)
    expected = transformers_greedy(qwen2_dir, prompts, GREEDY.max_tokens)
    results = {}
    for device in ("auto", "cpu"):
        engine = make_engine(qwen2_dir, block_size=4, device=device)
        results[device] = run_engine(engine, prompts, GREEDY)
        assert [r.token_ids for r in results[device]] == expected, device
        stats = engine.stats()
        assert stats["device"] == "cpu" and stats["dtype"] == "float32"
        assert stats["output_cache_device"] == "cpu"
        kv = sum(t.numel() * t.element_size() for pair in engine.runner.kv_caches for t in pair)
        assert stats["kv_cache_bytes"] == kv > 0
        assert stats["memory_allocated_bytes"] == kv + stats["output_cache_bytes"]
        assert all(t.device.type == "cpu" for pair in engine.runner.kv_caches for t in pair)
    for auto, cpu in zip(results["auto"], results["cpu"], strict=True):
        assert torch.equal(auto.tensors["hidden_states"], cpu.tensors["hidden_states"])


@pytest.mark.slow
def test_omni_stats_show_device_and_dtype_per_stage(omni_dir):
    with Omni(model=omni_dir, runtime={"backend": "local"}, **OMNI_ON_CPU) as omni:
        stats = omni.stats()
    assert set(stats) == {"thinker", "talker", "token2wav"}
    for name, stage in stats.items():
        assert stage["device"] == "cpu" and stage["dtype"] == "float32", name
        assert stage["memory_allocated_bytes"] >= 0, name
    assert stats["thinker"]["memory_allocated_bytes"] > stats["thinker"]["kv_cache_bytes"] > 0
    assert stats["token2wav"]["memory_allocated_bytes"] == 0  # no caches in a vocoder stage


@pytest.mark.slow
def test_bfloat16_stages_run_on_the_cpu(omni_dir):
    """The GPU default dtype, here on the CPU: every adapter's dtype handling (upstream rows in
    another dtype, the talker's per-request state) runs end to end."""
    overrides = {f"stages.{s}.engine.dtype": "bfloat16" for s in ("thinker", "talker")}
    overrides.update(OMNI_ON_CPU)
    params = [
        SamplingParams(max_tokens=4, ignore_eos=True),
        SamplingParams(max_tokens=12, ignore_eos=True),
        SamplingParams(max_tokens=1, seed=0),
    ]
    with Omni(model=omni_dir, runtime={"backend": "local"}, **overrides) as omni:
        (out,) = omni.generate([{"prompt": "hello there"}], params, use_tqdm=False)
        stats = omni.stats()
    assert out.error is None, out.error
    assert len(out.stages["talker"].token_ids) == 12 and out.final.audio.numel() > 0
    assert out.stages["thinker"].tensors == {} or all(
        t.dtype == torch.bfloat16 for t in out.stages["thinker"].tensors.values()
    )
    assert stats["thinker"]["dtype"] == stats["talker"]["dtype"] == "bfloat16"
    assert stats["token2wav"]["dtype"] == "float32"


# ---- the output cache's asynchronous write path, degenerate on the CPU ------------------------


def test_async_copy_path_writes_the_same_rows():
    """Random steps over fragmented block tables: the staged path (a GPU stage's, here with
    plain CPU copies) leaves exactly the rows the indexed write does once synchronized."""
    rng = np.random.default_rng(0)
    caches = {mode: OutputCache(16, 4, torch.float32, async_copies=mode) for mode in (False, True)}
    for cache in caches.values():
        cache.allocate("hidden_states", (3,))
        cache.step = 1
    # Pinned staging where CUDA is there to copy from (unpinned without it); the cache itself
    # is plain host memory either way.
    assert caches[True]._copies is not None
    assert caches[True].pinned_staging == torch.cuda.is_available()
    assert not any(cache.is_pinned() for cache in caches[True].caches.values())
    for _ in range(20):
        num = int(rng.integers(1, 30))
        slots = torch.from_numpy(rng.choice(64, size=num, replace=False).astype(np.int64))
        rows = {
            "hidden_states": torch.randn(num, 3, dtype=torch.float64),  # converted on write
            "extra": torch.randn(num, 2),
        }
        for cache in caches.values():
            cache.discover(rows, num)
            cache.write(slots, rows)
    sync, copied = caches[False], caches[True]
    assert set(copied.caches) == {"hidden_states", "extra"}
    copied.synchronize()
    for name in sync.caches:
        assert torch.equal(sync.caches[name], copied.caches[name]), name
    table = [3, 0, 9, 7]
    got = copied.gather(table, 14, admitted_step=2)
    want = sync.gather(table, 14, admitted_step=2)
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in got)
    assert got["hidden_states"].shape == (14, 3)
    window = copied.rows(table, 5, 11)
    assert all(torch.equal(window[k], sync.rows(table, 5, 11)[k]) for k in window)
    # Results never alias the cache: a later write leaves them as they were.
    before = got["hidden_states"].clone()
    copied.write(torch.arange(64), {"hidden_states": torch.zeros(64, 3)})
    assert torch.equal(got["hidden_states"], before)


def test_staged_write_is_one_copy_per_output_whatever_the_slots():
    """A step of 12 rows over 12 scattered slots: one copy of each output into staging and one
    host scatter of each, not one copy per run of consecutive slots. The rows reach the cache
    at the next read (or write), in write order: a slot written twice keeps the later rows."""
    cache = OutputCache(16, 4, torch.float32, async_copies=True)
    cache.allocate("hidden_states", (3,))
    cache.allocate("extra", (2,))
    slots = torch.tensor([9, 3, 40, 41, 17, 0, 63, 22, 5, 30, 31, 12])
    rows = {"hidden_states": torch.randn(12, 3), "extra": torch.randn(12, 2)}
    with _Ops() as seen:
        cache.write(slots, rows)
    assert seen.count("_to_copy") == 2 and seen.count("copy_") == 0
    assert not cache.caches["hidden_states"].any()  # staged, not yet scattered
    later = {"hidden_states": torch.full((2, 3), 7.0), "extra": torch.zeros(2, 2)}
    with _Ops() as seen:
        cache.write(torch.tensor([3, 41]), later)  # the first write lands now (no stream)
    assert seen.count("index_copy_") == 2
    got = cache.rows([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15], 0, 64)
    want = torch.zeros(64, 3)
    want[slots] = rows["hidden_states"]
    want[[3, 41]] = 7.0
    assert torch.equal(got["hidden_states"], want)


def test_rows_read_beside_a_step_in_flight_leave_its_write_staged():
    """engine.async_scheduling streams a step's rows while the next step, launched ahead, has
    written its own: rows(writes_in_flight=1) scatters (and on a GPU waits for) every write
    but that last one, which lands at the next read."""
    cache = OutputCache(16, 4, torch.float32, async_copies=True)
    cache.allocate("hidden_states", (3,))
    cache.write(torch.tensor([0, 1]), {"hidden_states": torch.ones(2, 3)})
    cache.write(torch.tensor([2]), {"hidden_states": torch.full((1, 3), 2.0)})  # step ahead
    got = cache.rows([0], 0, 3, writes_in_flight=1)["hidden_states"]
    assert torch.equal(got, torch.tensor([[1.0] * 3, [1.0] * 3, [0.0] * 3]))
    assert torch.equal(cache.rows([0], 2, 3)["hidden_states"], torch.full((1, 3), 2.0))


def test_rows_staged_in_inference_mode_are_read_outside_it():
    """The engine allocates the cache in its warm-up forward and writes it in `execute`, both
    under inference mode, but reads a finished request's rows in `update`, outside it: the
    read's scatter of staged rows must not trip over the inference-mode cache (on an H200 it
    did whenever a copy was still staged at the read)."""
    cache = OutputCache(16, 4, torch.float32, async_copies=True)
    rows = torch.randn(5, 3)
    with torch.inference_mode():
        cache.discover({"hidden_states": torch.zeros(5, 3)}, 5)
        cache.write(torch.arange(5), {"hidden_states": rows})
    assert torch.equal(cache.gather([0, 1], 5, admitted_step=1)["hidden_states"], rows)


class _Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))

    def count(self, name: str) -> int:
        return self.names.count(name)


@pytest.mark.slow
def test_engine_outputs_through_the_async_copy_path(qwen2_dir, monkeypatch):
    from transformers import AutoConfig

    prompts = shared_prefix_prompts(AutoConfig.from_pretrained(qwen2_dir).vocab_size, 6, seed=2)
    tiny = {"block_size": 4, "num_blocks": 40, "max_model_len": 128}
    reference = run_engine(make_engine(qwen2_dir, **tiny), prompts, GREEDY)
    monkeypatch.setattr(
        stage_engine, "OutputCache", functools.partial(OutputCache, async_copies=True)
    )
    engine = make_engine(qwen2_dir, **tiny)
    assert engine.output_cache._copies is not None
    for prefix in ("a", "b"):  # the second round is served from the caches
        results = run_engine(engine, prompts, GREEDY, prefix=prefix)
        for got, want in zip(results, reference, strict=True):
            assert got.token_ids == want.token_ids
            assert torch.equal(got.tensors["hidden_states"], want.tensors["hidden_states"])
    stats = engine.stats()
    assert stats["output_hit_rows"] > 0 and stats["preemptions"] > 0


# ---- host-side facts the adapters use instead of reading device tensors ------------------------


def test_talker_positions_from_the_host_equal_the_masked_lookup():
    """Host positions of any fed range: the prompt's mrope rows, then t + rope_delta."""
    mrope = (np.arange(3 * 7).reshape(3, 7) * 10).astype(np.int64)
    state = TalkerRequestState(
        num_rows=12, prompt_len=7, codec_prefix=None, mrope=mrope, rope_delta=-3
    )
    for first in range(0, 11):
        for n in range(1, 12 - first):
            t = np.arange(first, first + n)
            want = np.tile(t - 3, (3, 1))
            want[:, t < 7] = mrope[:, t[t < 7]]
            assert np.array_equal(state.positions(first, n), want), (first, n)
    state.mrope = None
    assert np.array_equal(state.positions(5, 4), np.tile(np.arange(5, 9), (3, 1)))


def test_packed_inputs_query_starts(qwen2_dir):
    engine = make_engine(qwen2_dir, block_size=4, num_blocks=32)
    for i, prompt in enumerate(([5, 6, 7], [8, 9, 10, 11, 12], [13])):
        engine.add_request(StageInput(f"r{i}", prompt, GREEDY))
    output = engine.scheduler.schedule()
    batch = engine.runner._pack(output.scheduled, engine.runner.requests.track(output.scheduled))
    inputs = batch.model_inputs
    assert inputs.query_starts == inputs.attn.query_start_loc.tolist() == [0, 3, 8, 9]
    assert inputs.device == torch.device("cpu") and batch.slot_mapping.device.type == "cpu"
