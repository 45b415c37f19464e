"""Stage replicas and the data plane on a two-node Ray cluster (ray.cluster_utils, a custom
`fake_gpu` resource standing for GPUs): the tiny Qwen2.5-Omni with 2 replicas of the talker and
of the vocoder, spread over the nodes. One cluster and one pipeline for the module (Ray is slow on 2 cores):
- 32 concurrent requests equal the one-replica run (local backend): tokens, codes, waveforms;
  every replica took some; the driver received no thinker or talker tensor bytes;
- `spread` put each stage's two replicas on different nodes; stats sum the replicas;
- cache-aware routing: requests sharing a prefix, one after another, all hit the talker's prefix
  cache (round-robin would send every second one to the replica that never saw it);
- killing one talker replica mid-load fails only requests it held; the rest equal the reference.
"""

from __future__ import annotations

import threading
import time

import pytest
import ray
import torch
from helpers import OMNI_ON_CPU

from omni import Omni
from omni.core.sampling_params import SamplingParams

pytestmark = [pytest.mark.ray, pytest.mark.slow]

STAGES = ("thinker", "talker", "token2wav")
REPLICATED_STAGES = ("talker", "token2wav")
PARAMS = [
    SamplingParams(max_tokens=4, ignore_eos=True),
    SamplingParams(max_tokens=6, ignore_eos=True),
    SamplingParams(max_tokens=1, seed=0),
]
PROMPTS = [f"request {i}: say something about {i * 7}" for i in range(32)]
REPLICATED = {
    **OMNI_ON_CPU,
    "runtime.placement": "spread",
    "runtime.request_timeout_s": 60,
    **{f"stages.{s}.resources.replicas": 2 for s in REPLICATED_STAGES},
    **{f"stages.{s}.resources.num_cpus": 0.25 for s in STAGES},
    **{f"stages.{s}.resources.custom": {"fake_gpu": 0.5} for s in STAGES},
}


@pytest.fixture(scope="module")
def reference(omni_dir):
    """The one-replica run (local backend: results are the same on every backend)."""
    with Omni(model=omni_dir, runtime={"backend": "local"}, **OMNI_ON_CPU) as omni:
        return omni.generate(PROMPTS, PARAMS, use_tqdm=False)


@pytest.fixture(scope="module")
def replicated(omni_dir, reference, ray_cluster):
    runtime = {"backend": "ray", "address": ray_cluster.address}  # 2 fake_gpu on each node
    with Omni(model=omni_dir, runtime=runtime, **REPLICATED) as omni:
        yield omni


def assert_same(output, expected, where: str) -> None:
    assert output.error is None, f"{where}: {output.error}"
    for stage in STAGES:
        got, want = output.stages[stage].token_ids, expected.stages[stage].token_ids
        assert got == want, f"{where}/{stage}"
    torch.testing.assert_close(output.final.audio, expected.final.audio, atol=1e-4, rtol=1e-3)


def test_replicas_equal_one_replica_and_the_driver_gets_no_upstream_tensors(replicated, reference):
    outputs = replicated.generate(PROMPTS, PARAMS, use_tqdm=False)
    for i, (output, expected) in enumerate(zip(outputs, reference, strict=True)):
        assert_same(output, expected, f"prompt {i}")
        assert output.stages["thinker"].tensors == {}  # runtime.return_tensors: final
    stats = replicated.stats()
    for stage in REPLICATED_STAGES:
        each = [stats[f"{stage}/{i}"] for i in range(2)]
        assert all(s["steps"] > 0 for s in each), (stage, each)  # both replicas worked
        assert stats[stage]["steps"] == sum(s["steps"] for s in each)
        assert stats[stage]["replicas"] == 2 and stats[stage]["replicas_down"] == []
        # spread: a stage's two replicas on the two nodes
        assert each[0]["node_id"] != each[1]["node_id"], stage
    # The thinker's hidden states and embeddings went actor to actor: no byte reached the
    # driver; the waveforms the caller gets back did.
    assert stats["thinker"]["driver_tensor_bytes"] == 0
    assert stats["talker"]["driver_tensor_bytes"] == 0
    waveforms = sum(o.final.audio.numel() * 4 for o in outputs)
    assert stats["token2wav"]["driver_tensor_bytes"] == waveforms


def test_cache_aware_routing_keeps_a_shared_prefix_on_one_replica(replicated):
    shared = "a long shared system prompt that every one of these requests starts with " * 2
    hits = []
    for i in range(6):  # one at a time: no replica is busier than the other
        (output,) = replicated.generate([f"{shared} question {i}?"], PARAMS, use_tqdm=False)
        assert output.error is None, output.error
        hits.append(output.stages["talker"].num_cached_tokens)
    # The talker's prompt begins with the thinker's: every request after the first finds the
    # shared blocks in the replica that took the first (one replica's hit rate).
    assert hits[0] == 0 and min(hits[1:]) >= 32 and len(set(hits[1:])) == 1, hits


def test_killing_a_replica_fails_only_its_requests(replicated, reference):
    backend = replicated.backend
    victim = backend.actors["talker/1"]
    held: set[str] = set()
    outputs: list = []
    runner = threading.Thread(
        target=lambda: outputs.extend(replicated.generate(PROMPTS, PARAMS, use_tqdm=False))
    )
    runner.start()
    deadline = time.monotonic() + 30
    while not held and time.monotonic() < deadline:
        with backend._lock:
            talkers = backend.replicas["talker"]
            held = {r for r, i in talkers.holder.items() if i == 1}
        time.sleep(0.005)
    assert held, "talker/1 never held a request"
    ray.kill(victim, no_restart=True)
    runner.join(timeout=60)
    failed = [o for o in outputs if o.error is not None]
    assert failed, "killing talker/1 failed no request"
    for output in failed:
        assert "'talker/1'" in output.error and "died" in output.error, output.error
    ok = 0
    for i, (output, expected) in enumerate(zip(outputs, reference, strict=True)):
        if output.error is None:
            assert_same(output, expected, f"prompt {i} beside a killed replica")
            ok += 1
    assert ok >= len(PROMPTS) // 2  # talker/0's and those that passed talker/1 before
    # /health stays up while talker/0 serves, naming the replica that is down (or restarting).
    down = replicated.check_health()
    assert all("talker/1" in why for why in down), down
