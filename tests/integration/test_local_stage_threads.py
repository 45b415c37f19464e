"""The local backend's stage threads (omni/backends/local.py) on the tiny Qwen2.5-Omni pipeline.

With every stage stepping on a thread of its own (`per_stage`: what each GPU stage gets under
`auto`), the pipeline gives the same thinker tokens, talker codes and audio as with one shared
thread, with the talker streamed from the thinker and the audio streamed from the talker; on a
CPU-only machine `auto` keeps the one shared thread; shutdown joins every thread.
"""

from __future__ import annotations

import pytest
import torch
from helpers import OMNI_ON_CPU

from omni import Omni
from omni.core.sampling_params import SamplingParams

pytestmark = pytest.mark.slow

PROMPTS = [{"prompt": "tell me about the sea"}, {"prompt": "and the mountains"}, [5, 6, 7, 8]]
PARAMS = [
    SamplingParams(max_tokens=6, ignore_eos=True),
    SamplingParams(max_tokens=40, ignore_eos=True, stop_token_ids=(8292, 8294)),
    SamplingParams(max_tokens=1, seed=0),
]


def run(omni_dir: str, stage_threads: str):
    """(which stages had a thread of their own, outputs); every thread joined on the way out."""
    with Omni(
        model=omni_dir, runtime={"backend": "local", "stage_threads": stage_threads}, **OMNI_ON_CPU
    ) as o:
        backend = o.backend
        own = {name: host.threaded for name, host in backend.hosts.items()}
        threads = [backend._thread] + [h._thread for h in backend.hosts.values() if h._thread]
        outputs = o.generate(PROMPTS, PARAMS, use_tqdm=False, stream_audio=True)
    assert not any(thread.is_alive() for thread in threads)
    return own, outputs


def test_per_stage_threads_equal_one_shared_thread(omni_dir):
    own_shared, shared = run(omni_dir, "shared")
    own_each, each = run(omni_dir, "per_stage")
    assert own_shared == dict.fromkeys(own_shared, False)
    assert own_each == dict.fromkeys(own_shared, True) and len(own_each) == 3
    for a, b in zip(shared, each, strict=True):
        assert a.error is None and b.error is None, (a.error, b.error)
        for stage in ("thinker", "talker"):
            assert a.stages[stage].token_ids == b.stages[stage].token_ids, stage
        assert a.final.audio.numel() > 0
        torch.testing.assert_close(a.final.audio, b.final.audio, atol=1e-5, rtol=1e-4)


def test_auto_keeps_cpu_stages_on_one_thread(omni_dir):
    with Omni(model=omni_dir, runtime={"backend": "local"}, **OMNI_ON_CPU) as o:
        assert o.config.runtime.stage_threads == "auto"
        assert all(host.engine.device.type == "cpu" for host in o.backend.hosts.values())
        assert not any(host.threaded for host in o.backend.hosts.values())
        assert o.backend._thread.is_alive()  # the shared stepping thread
