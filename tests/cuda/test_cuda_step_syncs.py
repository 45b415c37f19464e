"""Host-device syncs per decode step on a GPU (tests/integration/test_step_syncs.py, on CUDA):
the sampler's ids copy is the step's only sync in the sampler, the talker and the output cache,
with the output cache in pinned host memory (staged side-stream copies) and on the GPU. On a
GPU the counter also sees real cross-device copies (blocking unless non_blocking from pinned
memory). What the rest of the step (the runner) does is printed, not asserted."""

from __future__ import annotations

import pytest

from tests.integration.test_step_syncs import NUM_COUNTED, causal_lm_counts, talker_counts
from tests.sync_counter import OTHER

pytestmark = [pytest.mark.cuda, pytest.mark.slow]


@pytest.mark.parametrize("where", ["cpu", "cuda"])
def test_causal_lm_decode_step_syncs_on_cuda(qwen2_dir, where):
    counter = causal_lm_counts(qwen2_dir, device="cuda", output_cache_device=where)
    sites = sorted(set(counter.sites[OTHER]))
    print(f"\n[causal_lm, output cache on {where}] elsewhere in the step: {sites}")
    assert counter.of("sampler") == ["tolist"] * NUM_COUNTED
    assert counter.of("output cache") == []


def test_talker_decode_step_syncs_on_cuda(omni_dir):
    counter = talker_counts(omni_dir, device="cuda")
    print(f"\n[talker] elsewhere in the step: {sorted(set(counter.sites[OTHER]))}")
    assert counter.of("talker") == []
    assert counter.of("sampler") == ["tolist"] * NUM_COUNTED
    assert counter.of("output cache") == []
