"""Streaming speech on Ray: pieces cross actor boundaries (rows and audio chunks as numpy through
the transport) and may be reordered by Ray's call threads; tokens must still equal the local
whole-sequence run, and the audio must come in chunks that join into the final waveform.
"""

from __future__ import annotations

import pytest
import torch
from helpers import OMNI_ON_CPU

from omni import Omni
from omni.core.sampling_params import SamplingParams

pytestmark = [pytest.mark.ray, pytest.mark.slow]

PROMPT = "hello there, how are you doing today"
PARAMS = [
    SamplingParams(max_tokens=12, ignore_eos=True),
    SamplingParams(max_tokens=60, stop_token_ids=(8292, 8294)),
    SamplingParams(max_tokens=1, seed=3),
]
CHUNKS = {"stages.token2wav.stream.chunk_size": 20, **OMNI_ON_CPU}


def test_streaming_on_ray_equals_the_whole_sequence_path(omni_dir, ray_cluster):
    with Omni(model=omni_dir, runtime={"backend": "local"}, **OMNI_ON_CPU) as omni:
        (exact,) = omni.generate([PROMPT], PARAMS, use_tqdm=False)
    with Omni(model=omni_dir, runtime={"backend": "ray"}, **CHUNKS) as omni:

        async def stream():
            return [o async for o in omni.async_omni.generate(PROMPT, PARAMS, stream_audio=True)]

        snapshots = omni._call(stream())
        stats = omni.stats()
    out = snapshots[-1]
    assert out.error is None, out.error
    for stage in ("thinker", "talker"):
        assert out.stages[stage].token_ids == exact.stages[stage].token_ids, stage
    sizes = sorted({len(s.final.audio) for s in snapshots if s.final.audio is not None})
    # Chunks that arrive in one poll share a snapshot: count them in the vocoder's stats.
    assert len(sizes) >= 2 and sizes[-1] == len(exact.final.audio), sizes
    assert stats["token2wav"]["chunks"] == 4  # 60 codes: 10, 20, 20, 10
    torch.testing.assert_close(out.final.audio, exact.final.audio, atol=1e-2, rtol=0)
