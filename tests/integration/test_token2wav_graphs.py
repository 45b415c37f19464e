"""token2wav's DiT evaluations through ChunkGraphs (stages/qwen2_5_omni/token2wav_graphs.py),
run on the CPU, where the graphs' padded shapes and reused buffers run eagerly: streamed chunks
equal the unpadded eager ones (padding rows and frames sit outside every real frame's
attention; the amplified DiT shows a leak as 1e-3 and more), a shape's buffers reloaded for
another solve give that solve's chunks, the least recently used shape is dropped, and
`engine.cuda_graphs` turns it on. The GPU's replays: tests/cuda/test_cuda_token2wav_graphs.py.
"""

from __future__ import annotations

import pytest
import torch

from omni.config import ConfigError, load_config
from omni.engine import GenerationEngine
from omni.engine.graph_plan import chunk_graphs
from omni.messages import InputDelta
from omni.runtime.stage_model import ChunkJob
from stages.qwen2_5_omni import token2wav_graphs
from stages.qwen2_5_omni.token2wav import OmniToken2WavAdapter
from stages.qwen2_5_omni.token2wav_graphs import ChunkGraphs
from stages.qwen2_5_omni.token2wav_vocoder import vocode, vocode_padded
from tests.integration.test_token2wav_stream import (
    SEED,
    amplify_dit,
    random_codes,
    streaming,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def amplified(omni_dir) -> OmniToken2WavAdapter:
    return amplify_dit(OmniToken2WavAdapter(omni_dir))


def graphed(omni_dir: str, max_rows: int = 4) -> OmniToken2WavAdapter:
    adapter = amplify_dit(OmniToken2WavAdapter(omni_dir))
    adapter.enable_cuda_graphs(max_rows)
    return adapter


def jobs_of(codes: list[int], seed: int = SEED) -> list[ChunkJob]:
    """Three chunks of one ODE schedule (padded to 4 rows), one of another (1 row)."""
    return [
        ChunkJob(tuple(codes[:15]), 0, 10, 0, 5, False, seed),
        ChunkJob(tuple(codes[:40]), 10, 30, 12, 10, False, seed + 1, {"speaker": "Ethan"}),
        ChunkJob(tuple(codes), 40, 60, 12, 12, True, seed, {"guidance_scale": 0.0}),
        ChunkJob(tuple(codes), 57, 60, 3, 0, True, seed, {"num_steps": 6}),
    ]


def assert_chunks_close(got: list[torch.Tensor], want: list[torch.Tensor]) -> None:
    assert [c.shape for c in got] == [c.shape for c in want]
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=0)


def test_padded_shapes():
    graphs = ChunkGraphs(frame_multiple=48, max_rows=6)
    assert graphs.padded_shape(1, 1) == (48, 1)
    assert graphs.padded_shape(48, 2) == (48, 2)
    assert graphs.padded_shape(49, 3) == (96, 4)
    assert graphs.padded_shape(10, 5) == (48, 6)  # the next power of two, capped at max_rows
    assert graphs.padded_shape(10, 7) == (48, 7)  # more than max_rows: as many as there are
    with pytest.raises(ValueError, match="frame_multiple 0"):
        ChunkGraphs(frame_multiple=0, max_rows=1)


def test_graphed_chunks_equal_eager_and_reuse_their_shapes(omni_dir, amplified):
    adapter = graphed(omni_dir)
    graphs = adapter.chunk_graphs
    assert graphs is not None
    first, second = random_codes(60, seed=1), random_codes(60, seed=2)
    assert_chunks_close(
        adapter.decode_chunks(jobs_of(first)), amplified.decode_chunks(jobs_of(first))
    )
    assert (graphs.num_captures, graphs.num_graphs) == (2, 2)
    assert graphs.num_replays == 36 + 20  # RK4: 4 evaluations per step, 10 and 6 time points
    # The same shapes, other codes and seeds: the buffers are reloaded, nothing is captured.
    got = adapter.decode_chunks(jobs_of(second, seed=SEED + 5))
    assert_chunks_close(got, amplified.decode_chunks(jobs_of(second, seed=SEED + 5)))
    assert graphs.num_captures == 2
    # BigVGAN: one padded batch shape (4 rows) per call, captured once.
    assert (graphs.num_vocoder_captures, graphs.num_vocoder_graphs) == (1, 1)
    assert graphs.num_vocoder_replays == 2
    stats = adapter.speed_stats()
    assert (stats["cuda_graphs"], stats["graph_captures"]) == (3, 3)


def test_the_least_recently_used_shape_is_dropped(omni_dir, amplified):
    adapter = graphed(omni_dir)
    graphs = adapter.chunk_graphs
    assert graphs is not None
    graphs.max_graphs = 1
    codes = random_codes(60, seed=3)
    for _ in range(2):  # two shapes per call, one kept: each solve captures again
        assert_chunks_close(
            adapter.decode_chunks(jobs_of(codes)), amplified.decode_chunks(jobs_of(codes))
        )
    assert (graphs.num_captures, graphs.num_graphs) == (4, 1)


def token2wav_stage(omni_dir: str, cuda_graphs: bool | None, **stream: object):
    """A streaming token2wav stage; `stream` adds to its `stream:` section."""
    stage = {
        "name": "token2wav",
        "model": omni_dir,
        "kind": "generation",
        "adapter": "qwen2_5_omni_token2wav",
        "engine": {"seed": SEED, "max_num_seqs": 4, "cuda_graphs": cuda_graphs},
        "stream": {
            "first_chunk_size": 4, "chunk_size": 8, "left_context": 8, "look_ahead": 4, **stream
        },
    }  # fmt: skip
    return load_config({"stages": [stage]}).stages[0]


def stream(stage: GenerationEngine, codes: list[int]) -> torch.Tensor:
    """One request streamed in two deltas; its audio (checked to be its chunks joined)."""
    stage.add_request(streaming("s", codes[:10]))
    stage.extend_request(InputDelta("s", codes[10:], finished=True))
    chunks, finished = [], []
    while stage.has_unfinished:
        output = stage.step()
        chunks += [u.audio for u in output.updates]
        finished += output.finished
    (result,) = finished
    assert len(chunks) > 1 and torch.equal(result.audio, torch.cat(chunks))
    return result.audio


@pytest.mark.parametrize("cuda_graphs", [True, None, False])
def test_the_engine_turns_them_on_by_config(omni_dir, amplified, cuda_graphs):
    """true: on (eager buffers on the CPU), the same audio; null: only on a GPU; false: off."""
    adapter = amplify_dit(OmniToken2WavAdapter(omni_dir))
    stage = GenerationEngine(token2wav_stage(omni_dir, cuda_graphs), model=adapter)
    assert stage.cuda_graphs is (cuda_graphs is True)
    # Warmed up at start-up: the first and steady chunks' shapes (here both 48 frames) in
    # batches of 1, 2 and 4 (max_num_seqs 4), for the DiT and BigVGAN; the request's chunks
    # then capture nothing new.
    at_start = stage.stats().get("graph_captures", 0)
    assert at_start == (6 if cuda_graphs else 0)
    codes = random_codes(30, seed=4)
    audio = stream(stage, codes)
    assert stage.stats().get("graph_captures", 0) == at_start
    eager = stream(GenerationEngine(token2wav_stage(omni_dir, False), model=amplified), codes)
    torch.testing.assert_close(audio, eager, atol=1e-4, rtol=0)
    stats = stage.stats()
    if cuda_graphs:
        assert stats["graph_captures"] > 0 and stats["graph_replays"] > 0
    else:
        assert stats["cuda_graphs"] == 0 and "graph_captures" not in stats


def test_true_without_a_graphed_decode_is_a_config_error(omni_dir):
    with pytest.raises(ConfigError, match=r"stages\.token2wav\.engine\.cuda_graphs"):
        chunk_graphs(token2wav_stage(omni_dir, True), object(), torch.device("cpu"))
    assert not chunk_graphs(token2wav_stage(omni_dir, None), object(), torch.device("cpu"))


@pytest.mark.parametrize("required", [False, True])
def test_a_failed_capture_falls_back_to_eager_unless_required(
    omni_dir, amplified, monkeypatch, required
):
    def fail(*args, **kwargs):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(token2wav_graphs, "VelocityGraph", fail)
    adapter = amplify_dit(OmniToken2WavAdapter(omni_dir))
    adapter.enable_cuda_graphs(4, required=required)
    codes = random_codes(60, seed=5)
    if required:
        with pytest.raises(RuntimeError, match="capturing"):
            adapter.decode_chunks(jobs_of(codes))
        return
    for _ in range(2):  # the first call fails and runs eagerly; the second tries no capture
        assert_chunks_close(
            adapter.decode_chunks(jobs_of(codes)), amplified.decode_chunks(jobs_of(codes))
        )
    graphs = adapter.chunk_graphs
    assert graphs is not None and graphs.num_graphs == 0 and graphs.num_captures == 0
    assert "capturing" in adapter.speed_stats()["graph_failure"]


def test_padded_vocoder_rows_equal_their_own_decode(omni_dir):
    """vocode_padded (every row's tail masked from device lengths, as its graph runs) gives
    each row the samples of its own unbatched decode, a padding row of one frame included."""
    adapter = OmniToken2WavAdapter(omni_dir)
    gen = torch.Generator().manual_seed(4)
    lengths = [30, 17, 48, 1]
    mels = [torch.randn(80, n, generator=gen) - 5 for n in lengths]
    batch = torch.zeros(4, 80, 48)
    for row, mel in enumerate(mels):
        batch[row, :, : mel.shape[1]] = mel
    with torch.inference_mode():
        processed = adapter.bigvgan.process_mel_spectrogram(batch)
        wav = vocode_padded(adapter.bigvgan, processed, torch.tensor(lengths))
        for row, mel in enumerate(mels):
            want = vocode(adapter.bigvgan, [mel])[0]
            torch.testing.assert_close(wav[row, : want.numel()], want, atol=1e-5, rtol=0)


def test_a_failed_vocoder_capture_leaves_bigvgan_eager(omni_dir, amplified, monkeypatch):
    def fail(*args, **kwargs):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(token2wav_graphs, "VocoderGraph", fail)
    adapter = graphed(omni_dir)
    codes = random_codes(60, seed=6)
    for _ in range(2):
        got = adapter.decode_chunks(jobs_of(codes))
        assert_chunks_close(got, amplified.decode_chunks(jobs_of(codes)))
    graphs = adapter.chunk_graphs
    assert graphs is not None and graphs.num_vocoder_graphs == 0 and graphs.num_graphs == 2
    assert "capturing" in adapter.speed_stats()["graph_failure"]


def test_a_required_graph_that_cannot_capture_stops_the_stage_at_start(omni_dir, monkeypatch):
    """cuda_graphs: true and the start-up warm-up's capture fails: the engine does not start."""

    def fail(*args, **kwargs):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(token2wav_graphs, "VelocityGraph", fail)
    adapter = OmniToken2WavAdapter(omni_dir)
    with pytest.raises(RuntimeError, match="capturing"):
        GenerationEngine(token2wav_stage(omni_dir, True), model=adapter)
