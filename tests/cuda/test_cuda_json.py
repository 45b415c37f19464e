"""Structured output on a GPU (tests/integration/test_json_output.py's oracle: transformers'
float32 generate with a brute-force grammar mask, on the CPU): a float32 stage with decode steps
replayed as CUDA graphs, steps launched ahead for the unconstrained rows; the packed token masks
go over in one upload and are unpacked on the device."""

from __future__ import annotations

import pytest
from helpers import make_engine

from tests.integration.test_json_output import SCHEMAS, check_reply, run_mixed
from tests.integration.test_json_output import case as case  # noqa: F401  # the fixture

pytestmark = [pytest.mark.cuda, pytest.mark.slow]


@pytest.mark.parametrize("ahead", [False, True])
def test_constrained_tokens_on_cuda_equal_transformers(case, ahead):  # noqa: F811
    model_dir, prompts, expected, tokenizer = case
    engine = make_engine(model_dir, device="cuda", dtype="float32", block_size=4,
                         num_blocks=512, max_num_seqs=8, async_scheduling=ahead)  # fmt: skip
    results = run_mixed(engine, prompts, "g-")
    for (name, i), want in expected.items():
        result = results[f"g-{name}-{i}"]
        assert result.token_ids == want, (name, i)
        check_reply(tokenizer, result, SCHEMAS[name])
    stats = engine.stats()
    assert stats["graph_steps"] > 0 and (stats["steps_launched_ahead"] > 0) == ahead, stats
