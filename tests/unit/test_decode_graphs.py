"""The padded decode ladder (omni/runtime/decode_graphs.py) and when a stage uses it
(omni/engine/graph_plan.py): bucket choice, scratch slots, what stays eager, config errors.
Token equality with transformers through whole engines is in test_engine_equality.py and
test_omni_thinker.py ("padded" cases); the CUDA capture itself in tests/cuda."""

from __future__ import annotations

import pytest
import torch
from helpers import make_engine, run_engine, shared_prefix_prompts

from omni.config import ConfigError, load_config
from omni.core.sampling_params import SamplingParams
from omni.core.scheduler_output import ScheduledRequest
from omni.engine.graph_plan import padded_decode
from omni.runtime.decode_graphs import batch_ladder, num_scratch_blocks

CPU = torch.device("cpu")


def test_ladder_and_scratch():
    assert batch_ladder(1) == [1]
    assert batch_ladder(5) == [1, 2, 4, 5]
    assert batch_ladder(8) == [1, 2, 4, 8]
    assert batch_ladder(16) == [1, 2, 4, 8, 16]
    assert batch_ladder(30) == [1, 2, 4, 8, 16, 24, 30]
    assert batch_ladder(64) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]
    assert num_scratch_blocks(16, 16) == 1
    assert num_scratch_blocks(17, 16) == 2
    assert num_scratch_blocks(5, 4) == 2


def _entry(request_id: str, num_tokens: int = 1, *, new=False, sample=True) -> ScheduledRequest:
    return ScheduledRequest(request_id, [7] * num_tokens, 9, [], new, sample, SamplingParams())


def test_bucket_takes_pure_decode_steps_only(qwen2_dir):
    engine = make_engine(qwen2_dir, block_size=4, cuda_graphs=True, max_num_seqs=6)
    graphs = engine.runner.decode_graphs
    assert graphs is not None and graphs.batch_sizes == [1, 2, 4, 6]
    decode = [_entry(f"r{i}") for i in range(3)]
    assert graphs.bucket(decode) == 4
    assert graphs.bucket(decode[:1]) == 1
    assert graphs.bucket(decode + [_entry("r3"), _entry("r4")]) == 6
    assert graphs.bucket([]) is None
    assert graphs.bucket([_entry(f"x{i}") for i in range(7)]) is None  # above the ladder
    assert graphs.bucket([*decode, _entry("p", 5)]) is None  # a prefill chunk in the step
    assert graphs.bucket([*decode, _entry("n", new=True)]) is None  # (re)admitted request
    assert graphs.bucket([*decode, _entry("s", sample=False)]) is None


def test_padding_rows_write_scratch_only(qwen2_dir):
    """Three requests decode in the bucket of four: the padding row's keys land in the scratch
    block past the pool, and the pool's blocks hold exactly what an unpadded run wrote."""
    prompts = shared_prefix_prompts(200, num_prompts=3)[:3]
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    padded = make_engine(qwen2_dir, block_size=4, cuda_graphs=True, max_num_seqs=4)
    plain = make_engine(qwen2_dir, block_size=4, max_num_seqs=4)
    got = run_engine(padded, prompts, params)
    want = run_engine(plain, prompts, params)
    assert [r.token_ids for r in got] == [r.token_ids for r in want]
    stats = padded.stats()
    assert stats["padded_rows"] > 0 and stats["kv_cache_bytes"] > plain.stats()["kv_cache_bytes"]
    num_blocks = padded.num_blocks
    for (k_pad, v_pad), (k_plain, v_plain) in zip(
        padded.runner.kv_caches, plain.runner.kv_caches, strict=True
    ):
        assert k_pad.shape[0] == num_blocks + num_scratch_blocks(4, 4)
        torch.testing.assert_close(k_pad[:num_blocks], k_plain, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(v_pad[:num_blocks], v_plain, rtol=1e-5, atol=1e-5)
        assert k_pad[num_blocks:].abs().sum() > 0  # the padding rows did write their keys


def test_triton_path_takes_the_static_metadata(qwen2_dir, monkeypatch):
    """With the Triton kernel forced on the CPU (interpreted), padded steps run on exactly the
    metadata a graph captures (static tile table, fixed-width tables): same tokens."""
    from omni.runtime import attention

    prompts = shared_prefix_prompts(200, num_prompts=3)[:3]
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    want = run_engine(make_engine(qwen2_dir, block_size=4), prompts, params)
    monkeypatch.setattr(attention, "uses_triton", lambda device: True)
    engine = make_engine(qwen2_dir, block_size=4, cuda_graphs=True, max_num_seqs=4)
    seen = []
    forward = engine.runner.decode_graphs._forward

    def spy(batch_size, *, static):
        seen.append((batch_size, static))
        return forward(batch_size, static=static)

    monkeypatch.setattr(engine.runner.decode_graphs, "_forward", spy)
    got = run_engine(engine, prompts, params)
    assert [r.token_ids for r in got] == [r.token_ids for r in want]
    assert seen and all(static for _, static in seen) and (4, True) in seen


class _Blocked:
    def decode_graph_blocker(self) -> str:
        return "a per-request Python forward"


class _Capturable:
    def decode_graph_blocker(self) -> None:
        return None


def test_plan_defaults_and_errors(qwen2_dir):
    def _stage(**engine):
        config = {"stages": [{"name": "llm", "model": qwen2_dir, "engine": engine}]}
        return load_config(config).stages[0]

    cuda = torch.device("cuda", 0)
    assert padded_decode(_stage(), _Capturable(), cuda) is True  # null: on for a GPU stage
    assert padded_decode(_stage(), _Capturable(), CPU) is False  # ... and off on the CPU
    assert padded_decode(_stage(cuda_graphs=True), _Capturable(), CPU) is True  # eager ladder
    assert padded_decode(_stage(cuda_graphs=False), _Capturable(), cuda) is False
    assert padded_decode(_stage(), _Blocked(), cuda) is False  # null: eager, reason logged
    assert padded_decode(_stage(), object(), cuda) is False  # no adapter hooks at all
    with pytest.raises(ConfigError, match=r"stages\.llm\.engine\.cuda_graphs.*per-request"):
        padded_decode(_stage(cuda_graphs=True), _Blocked(), cuda)
    with pytest.raises(ConfigError, match="cuda_graphs"):
        _stage(cuda_graphs="yes")
