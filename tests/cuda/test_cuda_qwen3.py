"""The Qwen3-Omni thinker's and talker's decode steps on a GPU (tiny checkpoint). In bfloat16
their MoE experts run grouped_mm (stages/qwen3_omni_moe/experts.py), so decode steps are captured
and replayed; the tokens agree with eager steps (printed: padding changes GEMM shapes, so bf16
rounding may differ) and every token's rows for the talker come back; the whole pipeline speaks
with both stages replaying, the talker's code predictor too. In float32 torch has no grouped GEMM on the GPU: the experts loop and
decode stays eager, with the same tokens as the CPU.

Run with `pytest -q tests/cuda -s`; skipped where torch sees no GPU (tests/conftest.py)."""

from __future__ import annotations

import pytest
import torch
from helpers import all_outputs, run_engine

from omni import Omni
from omni.config import load_config
from omni.core.sampling_params import SamplingParams
from omni.engine import StageEngine

pytestmark = [pytest.mark.cuda, pytest.mark.slow]

MAX_NEW = 12
GREEDY = SamplingParams(max_tokens=MAX_NEW, ignore_eos=True)
PROMPTS = [[(7 * i + 3 * j) % 500 + 1 for j in range(20 + 3 * i)] for i in range(5)]


@pytest.fixture(scope="module")
def qwen3_dir():
    from tools.make_tiny_checkpoint import ensure_checkpoint

    return str(ensure_checkpoint("qwen3_omni_moe", "tiny"))


def _thinker(model_dir: str, **engine: object) -> StageEngine:
    engine = {"block_size": 4, "num_blocks": 512, "max_num_seqs": 6, **engine}
    stage = {"name": "thinker", "model": model_dir, "adapter": "qwen3_omni_moe_thinker"}
    return StageEngine(
        all_outputs(load_config({"stages": [{**stage, "engine": engine}]}).stages[0])
    )


def test_bfloat16_thinker_replays_decode_graphs(qwen3_dir):
    config = {"device": "cuda", "dtype": "bfloat16"}
    graphs = _thinker(qwen3_dir, **config)
    assert graphs.runner.decode_graphs is not None
    got = run_engine(graphs, PROMPTS, GREEDY)
    base = run_engine(_thinker(qwen3_dir, **config, cuda_graphs=False), PROMPTS, GREEDY)
    stats = graphs.stats()
    assert stats["cuda_graphs"] > 0 and stats["graph_steps"] > 0 and stats["padded_rows"] > 0
    for result, eager in zip(got, base, strict=True):
        length = len(result.prompt_token_ids) + MAX_NEW - 1  # every fed token's rows
        assert result.tensors["accept_hidden_states"].shape[0] == length
        assert result.tensors["inputs_embeds"].shape[0] == length
        # The replayed rows (routing, grouped experts) are the eager ones up to bf16 rounding,
        # as far as both fed the same tokens.
        fed = [a == b for a, b in zip(result.token_ids, eager.token_ids, strict=True)]
        same_rows = len(result.prompt_token_ids) + (fed.index(False) if False in fed else length)
        torch.testing.assert_close(
            result.tensors["accept_hidden_states"][:same_rows].float(),
            eager.tensors["accept_hidden_states"][:same_rows].float(),
            atol=0.1,
            rtol=0.05,
        )
    same = sum(
        a == b
        for r, s in zip(got, base, strict=True)
        for a, b in zip(r.token_ids, s.token_ids, strict=True)
    )
    share = same / (len(PROMPTS) * MAX_NEW)
    print(f"\nQwen3-Omni thinker, bfloat16 graph vs eager: {share:.1%} of tokens equal")
    assert share > 0.5


def test_float32_thinker_stays_eager_with_cpu_tokens(qwen3_dir):
    gpu = _thinker(qwen3_dir, device="cuda", dtype="float32")
    assert gpu.runner.decode_graphs is None  # the experts loop: a host sync per layer
    got = run_engine(gpu, PROMPTS, GREEDY)
    want = run_engine(_thinker(qwen3_dir, device="cpu"), PROMPTS, GREEDY)
    assert [r.token_ids for r in got] == [r.token_ids for r in want]


def test_bfloat16_pipeline_replays_thinker_and_talker_steps(qwen3_dir):
    stages = ("thinker", "talker", "code2wav")
    overrides: dict = {f"stages.{s}.engine.device": "cuda" for s in stages}
    for stage in ("thinker", "talker"):
        overrides[f"stages.{stage}.engine.dtype"] = "bfloat16"
    prompts = [{"prompt": f"say something about the number {i}"} for i in range(3)]
    params = [
        SamplingParams(max_tokens=8, ignore_eos=True),
        SamplingParams(max_tokens=16),
        SamplingParams(max_tokens=1),
    ]
    runs = {}
    for graphs, ahead in ((True, False), (False, False), (True, True)):
        sets = {**overrides, **{f"stages.{s}.engine.cuda_graphs": graphs for s in stages[:2]}}
        sets |= {f"stages.{s}.engine.async_scheduling": ahead for s in stages[:2]}
        with Omni(model=qwen3_dir, runtime={"backend": "local"}, **sets) as omni:
            outputs = omni.generate(prompts, params, use_tqdm=False)
            stats = omni.stats()
            predictor = omni.backend.hosts["talker"].engine.model._predictor
        if graphs:  # greedy frames: the code predictor replayed too, every size captured
            assert predictor.graphs.failure is None and predictor.num_replayed > 0
            assert predictor.graphs.num_captures == len(predictor.ladder)
        for out in outputs:
            assert out.error is None and out.final.audio.numel() > 0
        for stage in ("thinker", "talker"):
            assert (stats[stage].get("graph_steps", 0) > 0) == graphs, (stage, stats[stage])
            assert stats[stage]["fused_modules"] > 0, (stage, stats[stage])  # norms, layers, ...
            assert (stats[stage]["steps_launched_ahead"] > 0) == ahead, (stage, stats[stage])
        runs[graphs, ahead] = [out.stages["talker"].token_ids for out in outputs]
    for other, name in (((False, False), "eager"), ((True, True), "graphs, launched ahead")):
        same = sum(
            a == b
            for r, s in zip(runs[True, False], runs[other], strict=True)
            for a, b in zip(r, s, strict=False)
        )
        share = same / max(sum(len(r) for r in runs[other]), 1)
        print(f"\nQwen3-Omni talker, bfloat16 graphs vs {name}: {share:.1%} of codes equal")
        assert share > 0.5
