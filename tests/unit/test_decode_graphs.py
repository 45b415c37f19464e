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
from omni.runtime.graph_shapes import batch_ladder, num_scratch_blocks, splits_keys, suffix_ladder

CPU = torch.device("cpu")


def test_ladder_and_scratch():
    assert batch_ladder(1) == [1]
    assert batch_ladder(5) == [1, 2, 4, 5]
    assert batch_ladder(8) == [1, 2, 4, 8]
    assert batch_ladder(16) == [1, 2, 4, 8, 16]
    assert batch_ladder(30) == [1, 2, 4, 8, 16, 24, 30]
    assert batch_ladder(64) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]
    assert suffix_ladder(2048) == [16, 32, 64, 128, 256]
    assert suffix_ladder(100) == [16, 32, 64]
    assert suffix_ladder(8) == []
    assert num_scratch_blocks(16, 8, 16) == 1  # one slot per padding row or token
    assert num_scratch_blocks(17, 8, 16) == 2
    assert num_scratch_blocks(5, 8, 4) == 2
    assert num_scratch_blocks(5, 2048, 16) == 16  # a suffix of 256
    assert num_scratch_blocks(5, 100, 16) == 4  # max_model_len 100: suffixes up to 64


def _entry(request_id: str, num_tokens: int = 1, *, new=False, sample=True) -> ScheduledRequest:
    return ScheduledRequest(request_id, [7] * num_tokens, 9, [], new, sample, SamplingParams())


def test_shapes_of_decode_batches_and_suffixes(qwen2_dir):
    engine = make_engine(
        qwen2_dir,
        device="cpu",
        block_size=4,
        cuda_graphs=True,
        max_num_seqs=6,
        max_num_batched_tokens=64,
        max_model_len=48,  # suffixes up to 32: the padding sequence fits the table width
    )
    graphs = engine.runner.decode_graphs
    assert graphs is not None and graphs.batch_sizes == [1, 2, 4, 6]
    assert graphs.suffix_sizes == [16, 32]
    decode = [_entry(f"r{i}") for i in range(3)]
    shape_for = graphs.shape_for
    assert shape_for(decode) == (4, 4)
    assert shape_for(decode[:1]) == (1, 1)
    assert shape_for([_entry("n", new=True)]) == (1, 1)  # the adapter may still refuse it
    assert shape_for(decode + [_entry("r3"), _entry("r4")]) == (6, 6)
    assert shape_for([_entry(f"x{i}") for i in range(7)]) is None  # above the ladder
    # One request's sampled suffix: padded to the next size with room for a padding sequence.
    assert shape_for([_entry("p", 5, new=True)]) == (2, 16)
    assert shape_for([_entry("p", 16)]) == (2, 32)
    assert shape_for([_entry("p", 31)]) == (2, 32)
    assert shape_for([_entry("p", 32)]) is None
    assert shape_for([]) is None
    assert shape_for([*decode, _entry("p", 5)]) is None  # a prefill chunk beside decodes
    assert shape_for([_entry("p", 5, sample=False)]) is None  # a chunk that samples nothing
    assert shape_for([*decode, _entry("s", sample=False)]) is None


@pytest.mark.parametrize("family", ["qwen2", "llama"])
def test_suffixes_after_prefix_hits_equal_eager(family, qwen2_dir, llama_dir):
    """Requests one after another share prefixes: their uncached suffixes run padded (one
    padding sequence over the scratch blocks), with the tokens and pool KV of eager steps."""
    model_dir = qwen2_dir if family == "qwen2" else llama_dir
    prompts = shared_prefix_prompts(200, num_prompts=6)
    params = SamplingParams(max_tokens=3, ignore_eos=True)
    padded = make_engine(
        model_dir, device="cpu", block_size=4, cuda_graphs=True, max_num_batched_tokens=64
    )
    plain = make_engine(model_dir, device="cpu", block_size=4, max_num_batched_tokens=64)
    shapes = []
    shape_for = padded.runner.decode_graphs.shape_for
    padded.runner.decode_graphs.shape_for = lambda s: shapes.append(shape_for(s)) or shapes[-1]
    for i, prompt in enumerate(prompts):
        got = run_engine(padded, [prompt], params, prefix=f"p{i}-")
        want = run_engine(plain, [prompt], params, prefix=f"p{i}-")
        assert got[0].token_ids == want[0].token_ids, i
        assert got[0].num_cached_tokens == want[0].num_cached_tokens
    assert sum(s is not None and s[0] == 2 for s in shapes) >= 3, shapes
    num_blocks = padded.num_blocks
    for (k_pad, _), (k_plain, _) in zip(
        padded.runner.kv_caches, plain.runner.kv_caches, strict=True
    ):
        torch.testing.assert_close(k_pad[:num_blocks], k_plain, rtol=1e-5, atol=1e-5)


def test_padding_rows_write_scratch_only(qwen2_dir):
    """Three requests decode in the bucket of four: the padding row's keys land in the scratch
    block past the pool, and the pool's blocks hold exactly what an unpadded run wrote."""
    prompts = shared_prefix_prompts(200, num_prompts=3)[:3]
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    padded = make_engine(qwen2_dir, device="cpu", block_size=4, cuda_graphs=True, max_num_seqs=4)
    plain = make_engine(qwen2_dir, device="cpu", block_size=4, max_num_seqs=4)
    got = run_engine(padded, prompts, params)
    want = run_engine(plain, prompts, params)
    assert [r.token_ids for r in got] == [r.token_ids for r in want]
    stats = padded.stats()
    assert stats["padded_rows"] > 0 and stats["kv_cache_bytes"] > plain.stats()["kv_cache_bytes"]
    num_blocks = padded.num_blocks
    for (k_pad, v_pad), (k_plain, v_plain) in zip(
        padded.runner.kv_caches, plain.runner.kv_caches, strict=True
    ):
        assert k_pad.shape[0] == num_blocks + num_scratch_blocks(4, 2048, 4)
        torch.testing.assert_close(k_pad[:num_blocks], k_plain, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(v_pad[:num_blocks], v_plain, rtol=1e-5, atol=1e-5)
        assert k_pad[num_blocks:].abs().sum() > 0  # the padding rows did write their keys


# As the interpreter tests of test_triton_paged_attention.py: measured on the GPU machine (torch
# 2.11, triton 3.6), the interpreted launch fails there ("only 0-dimensional arrays can be
# converted to Python scalars"); tests/cuda/test_cuda_graphs.py runs the compiled kernel.
@pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter test; the GPU runs compiled")
@pytest.mark.parametrize("split", [False, True], ids=["whole", "split-kv"])
def test_triton_path_takes_the_static_metadata(qwen2_dir, monkeypatch, split):
    """With the Triton kernel forced on the CPU (interpreted), padded steps run on exactly the
    metadata a graph captures (static tile table, fixed-width tables): same tokens. split-kv:
    on a GPU's SM count, the graph's context bound (max_model_len) splits every step's keys,
    4 shares of 16 keys or more here (a 64-key tile each): 5 to 120-token contexts."""
    from kernels import split_kv
    from omni.runtime import attention

    combined: list[int] = []
    if split:
        monkeypatch.setattr(split_kv, "num_sms", lambda device: 132)
        monkeypatch.setattr(split_kv, "MIN_SHARE", 16)
        monkeypatch.setattr(split_kv, "MAX_SPLITS", 4)  # the interpreter runs every program
        combine = split_kv.combine_splits
        monkeypatch.setattr(
            split_kv, "combine_splits", lambda *a: combined.append(a[0].shape[0]) or combine(*a)
        )

    prompts = shared_prefix_prompts(200, num_prompts=3)[:3]
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    plain = make_engine(qwen2_dir, device="cpu", block_size=4)
    want = run_engine(plain, prompts, params)
    monkeypatch.setattr(attention, "uses_triton", lambda device: True)
    engine = make_engine(qwen2_dir, device="cpu", block_size=4, cuda_graphs=True, max_num_seqs=4)
    seen = []
    forward = engine.runner.decode_graphs._forward

    def spy(shape, long, *, static):
        seen.append((shape, long, static))
        return forward(shape, long, static=static)

    monkeypatch.setattr(engine.runner.decode_graphs, "_forward", spy)
    got = run_engine(engine, prompts, params)
    assert [r.token_ids for r in got] == [r.token_ids for r in want]
    # A suffix after a prefix hit: its tile table is computed on the device from query starts.
    longer = [prompts[0] + [5, 6, 7]]
    got = run_engine(engine, longer, params, prefix="s")
    assert got[0].token_ids == run_engine(plain, longer, params, prefix="s")[0].token_ids
    assert got[0].num_cached_tokens > 0
    assert all(static for *_, static in seen) and {(4, 4), (2, 16)} <= {s for s, *_ in seen}
    # Long steps (a context past two shares: 511 keys, 31 here) may split; short ones never.
    assert any(long for _, long, _ in seen) == split
    stats = engine.runner.decode_graphs.stats()
    assert stats["long_context_graphs"] == 0  # nothing captured on the CPU
    assert stats["long_context_steps"] == sum(long for _, long, _ in seen)
    assert min(combined) > 1 if split else combined == [], combined


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
    # The ladder's top: max_num_seqs up to a default cap, max_graph_batch where given.
    assert _stage().engine.graph_batch_limit == 32  # max_num_seqs' default
    assert _stage(max_num_seqs=4096).engine.graph_batch_limit == 256
    assert _stage(max_num_seqs=4096, max_graph_batch=512).engine.graph_batch_limit == 512
    assert _stage(max_num_seqs=6, max_graph_batch=512).engine.graph_batch_limit == 6
    with pytest.raises(ConfigError, match=r"stages\.llm\.engine\.max_graph_batch.*got 0"):
        _stage(max_graph_batch=0)


def test_which_shapes_get_a_long_context_graph():
    """A second graph (keys split) only where a long context would split them: a bound past two
    shares, and a grid under the SM count (a decode batch: B x kv heads; a suffix: always)."""
    assert splits_keys((2, 16), 4096, 2, 132) and splits_keys((1, 1), 4096, 2, 132)
    assert splits_keys((16, 16), 4096, 2, 132)  # 32 programs
    assert not splits_keys((64, 64), 4096, 4, 132)  # 256 programs fill an H100
    assert not splits_keys((1, 1), 511, 2, 132) and not splits_keys((2, 16), 511, 2, 132)
    assert not splits_keys((1, 1), 4096, 2, 0)  # no SM count: never split
