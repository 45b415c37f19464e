"""No Triton compile under live traffic: once a stage has started (its warm-up's prefill and
decode, and its CUDA-graph capture), steps of any composition (odd and even token counts, batch
sizes 1 to 17, prefix hits, index tensors wherever the step's upload puts them) reuse the
attention kernels compiled then. Each compile costs hundreds of ms on the request that meets it;
tests/unit/test_kernel_specialization.py checks the specialization keys on the CPU.

Run with `pytest -q tests/cuda -s`; skipped where torch sees no GPU (tests/conftest.py)."""

from __future__ import annotations

import pytest
from helpers import make_engine

import kernels.triton_paged_attention as tpa
from kernels import split_kv, triton_launch
from omni.core.sampling_params import SamplingParams
from omni.messages import StageInput

pytestmark = [pytest.mark.cuda, pytest.mark.slow]


def num_compiled() -> int:
    """Variants of the attention kernel and its split-KV combine compiled in this process, on
    every device."""
    return triton_launch.num_compiled(tpa._kernel) + triton_launch.num_compiled(split_kv._combine)


@pytest.mark.parametrize("long", [False, True], ids=["short", "split-kv"])
@pytest.mark.parametrize("cuda_graphs", [False, True], ids=["eager", "graphs"])
def test_live_steps_compile_no_attention_kernel(qwen2_dir, cuda_graphs, long):
    """split-kv: contexts past two shares (512 keys), so steps split their keys (eager: by the
    step's longest sequence; graphs: the long-context graphs)."""
    engine = make_engine(
        qwen2_dir, device="cuda", dtype="bfloat16", block_size=4, num_blocks=4096 if long else 512,
        max_model_len=1024 if long else 128, max_num_seqs=24, cuda_graphs=cuda_graphs,
    )  # fmt: skip
    started = num_compiled()
    assert started > 0  # the warm-up ran the kernels
    lengths = [1, 2, 3, 8, 15, 16, 17, 31, 32, 33, 5, 6, 7, 9, 10, 11, 12, 13, 14, 18]
    if long:
        lengths = [n + 600 for n in lengths]
    for round_ in range(2):  # the second round hits the first one's cached prefixes
        for i, n in enumerate(lengths):
            ids = [(7 * i + j) % 500 + 3 for j in range(n)]
            params = SamplingParams(max_tokens=3 + i % 5, ignore_eos=True)
            engine.add_request(StageInput(f"{round_}-{i}", ids, params))
            if i % 3 == 0:
                engine.step()  # staggered: batches of every size and mix
        results = engine.run_until_done()
        assert all(r.error is None for r in results)
    print(f"\n[cuda_graphs={cuda_graphs}] attention variants compiled at start: {started}")
    assert num_compiled() == started
