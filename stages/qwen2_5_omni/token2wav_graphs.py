"""CUDA graphs of streamed token2wav chunks: the DiT's ODE evaluations and BigVGAN.

Why: one DiT forward of the 7B layout (22 blocks, CFG rows included) is about 900 kernels, and
a chunk's RK4 solve runs 4 * (num_steps - 1) = 36 of them, so an eager chunk is bound by
launching ~32,000 kernels from Python (on an H200, with the thinker and talker threads sharing
the GIL, first audio came 1.6 s after the talker's first code). A graph replays one whole
forward as one launch. BigVGAN then is ~2,600 more kernels per batch of chunks (the 7B layout),
replayed as one graph too.

Shapes: a graph is fixed to (rows, frames). solve_mels pads a batch of chunks to the next
power-of-two rows and to a multiple of `frame_multiple` frames (padding sits outside every real
frame's attention, as batching already does), so the chunk sizes of a stream (the first, the
steady ones, the last) fall into a few shapes; BigVGAN's batch takes the same padded shape (its
padding rows one frame long: a row needs a last sample to replicate). Each shape is captured on
first use and kept in an LRU (omni/runtime/graph_cache.py); a failed capture leaves the chunks
eager, unless `cuda_graphs: true`.

Buffers: each graph owns copies of its inputs. A solve copies its conditioning, rotary cos/sin,
block differences and guidance in once (`load`); each evaluation copies the time and state in,
replays, and clones the output (RK4 holds four of them at once). BigVGAN's graph takes the mels
and lengths, and masks every row's tail from the lengths on the device (eager vocode skips the
masks of rows that fill the batch: the same values). On the CPU (cuda_graphs true there) the
same padded shapes and buffers run eagerly: what the CPU tests check.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from omni.runtime.graph_cache import GraphCache, capture_graph
from omni.runtime.host_upload import upload
from stages.qwen2_5_omni.token2wav_dit import dit_velocity, eager_velocity
from stages.qwen2_5_omni.token2wav_vocoder import vocode_padded

Shape = tuple[object, ...]  # the inputs' shapes and the autocast dtype


class VelocityGraph:
    """One (rows, frames) shape of dit_velocity: captured on a GPU, eager buffers elsewhere."""

    def __init__(
        self,
        dit: nn.Module,
        inputs: tuple[torch.Tensor, ...],
        state: torch.Tensor,
        time_step: torch.Tensor,
        pool: object | None,
        autocast: torch.dtype | None = None,
    ) -> None:
        # time, state, then the solve's inputs (static, cos, sin, block_diff, guidance)
        self._buffers = [t.clone() for t in (time_step, state, *inputs)]
        self._run = functools.partial(dit_velocity, dit, *self._buffers, autocast=autocast)
        self._graph = None
        if state.device.type == "cuda":
            self._graph, self._output = capture_graph(self._run, state.device, pool)

    def load(self, inputs: tuple[torch.Tensor, ...]) -> None:
        """A new solve's inputs, of this graph's shapes."""
        for buffer, value in zip(self._buffers[2:], inputs, strict=True):
            buffer.copy_(value)

    def __call__(self, time_step: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        self._buffers[0].copy_(time_step)
        self._buffers[1].copy_(state)
        if self._graph is None:
            return self._run()
        self._graph.replay()
        return self._output.clone()


class VocoderGraph:
    """One (rows, frames) shape of BigVGAN (vocode_padded): captured on a GPU, eager elsewhere."""

    def __init__(self, bigvgan: nn.Module, mels: torch.Tensor, lengths: torch.Tensor, pool: object):
        self._bigvgan = bigvgan
        self._mels = bigvgan.process_mel_spectrogram(mels)  # eager: see vocode_padded
        self._lengths = lengths.clone()
        self._run = functools.partial(vocode_padded, bigvgan, self._mels, self._lengths)
        self._graph = None
        if mels.device.type == "cuda":
            self._graph, self._output = capture_graph(self._run, mels.device, pool)

    def __call__(self, mels: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """[rows, samples]: each row's waveform, valid up to its length * hop (the caller cuts
        and copies its rows before the next call)."""
        self._mels.copy_(self._bigvgan.process_mel_spectrogram(mels))
        self._lengths.copy_(lengths)
        if self._graph is None:
            return self._run()
        self._graph.replay()
        return self._output


class ChunkGraphs:
    """A token2wav stage's graphs: the DiT's velocity (solve_mels' `graphs`) and BigVGAN."""

    def __init__(
        self,
        *,
        frame_multiple: int,
        max_rows: int,
        max_graphs: int = 24,
        required: bool = False,
        bigvgan: nn.Module | None = None,
    ) -> None:
        """frame_multiple: frames are padded to a multiple of it; max_rows: the most chunks a
        step batches (rows are padded to a power of two, at most this); required: a failed
        capture raises (else it is logged and the chunks run eagerly from then on); bigvgan:
        also replay the vocoder (`vocode`)."""
        if frame_multiple < 1 or max_rows < 1 or max_graphs < 1:
            raise ValueError(
                f"frame_multiple {frame_multiple}, max_rows {max_rows} and max_graphs "
                f"{max_graphs} must be positive"
            )
        self._bigvgan = bigvgan
        self.frame_multiple = frame_multiple
        self.max_rows = max_rows
        self._velocity: GraphCache[VelocityGraph] = GraphCache(
            "token2wav DiT", max_graphs=max_graphs, required=required
        )
        self._vocoder: GraphCache[VocoderGraph] = GraphCache(
            "token2wav BigVGAN", max_graphs=max_graphs, required=required
        )
        self.num_replays = 0  # DiT evaluations through a graph (or its eager buffers)
        self.num_vocoder_replays = 0  # BigVGAN batches through a graph

    @property
    def max_graphs(self) -> int:
        return self._velocity.max_graphs

    @max_graphs.setter
    def max_graphs(self, value: int) -> None:
        self._velocity.max_graphs = self._vocoder.max_graphs = value

    @property
    def num_graphs(self) -> int:
        """DiT shapes kept (BigVGAN's: num_vocoder_graphs)."""
        return len(self._velocity)

    @property
    def num_vocoder_graphs(self) -> int:
        return len(self._vocoder)

    @property
    def num_captures(self) -> int:
        """DiT shapes captured (BigVGAN's: num_vocoder_captures)."""
        return self._velocity.num_captures

    @property
    def num_vocoder_captures(self) -> int:
        return self._vocoder.num_captures

    @property
    def capture_s(self) -> float:
        return self._velocity.capture_s + self._vocoder.capture_s

    @property
    def failure(self) -> str | None:
        return self._velocity.failure or self._vocoder.failure

    def padded_shape(self, num_frames: int, num_jobs: int) -> tuple[int, int]:
        """(frames, rows) a batch of num_jobs chunks of up to num_frames frames runs as."""
        frames = -(-num_frames // self.frame_multiple) * self.frame_multiple
        rows = 1 << (num_jobs - 1).bit_length()
        return frames, max(num_jobs, min(rows, self.max_rows))

    def velocity(
        self,
        dit: nn.Module,
        inputs: tuple[torch.Tensor, ...],
        state: torch.Tensor,
        time_step: torch.Tensor,
        autocast: torch.dtype | None = None,
    ) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
        """The graph of these shapes and precision (captured now if new, of `dit`: a caller
        passes one DiT per precision), loaded with this solve's inputs; an eager velocity once
        a capture has failed."""
        shape: Shape = (*(tuple(t.shape) for t in (state, *inputs)), autocast)
        cache = self._velocity
        graph = cache.get(
            shape,
            lambda: VelocityGraph(dit, inputs, state, time_step, cache.pool, autocast),
            state.device,
        )
        if graph is None:
            return functools.partial(eager_velocity, dit, inputs, autocast)
        graph.load(inputs)
        return _Counted(graph, self)

    def vocode(self, mels: list[torch.Tensor]) -> list[torch.Tensor] | None:
        """Each mel [mel_dim, frames] -> its 1-D waveform (frames * hop samples), through the
        graph of the batch's padded shape; None without a vocoder graph (failed, or none)."""
        if self._bigvgan is None or self._vocoder.failure is not None:
            return None
        lengths = [mel.shape[1] for mel in mels]
        frames, rows = self.padded_shape(max(lengths), len(mels))
        device = mels[0].device
        batch = torch.zeros(rows, mels[0].shape[0], frames, device=device)
        for row, mel in enumerate(mels):
            batch[row, :, : mel.shape[1]] = mel
        # Padding rows: one frame (a row needs a last sample to replicate); never read.
        host = np.asarray(lengths + [1] * (rows - len(mels)), dtype=np.int64)
        on_device = upload([host], device)[0]
        cache, bigvgan = self._vocoder, self._bigvgan
        key = (tuple(batch.shape), "bigvgan")
        graph = cache.get(key, lambda: VocoderGraph(bigvgan, batch, on_device, cache.pool), device)
        if graph is None:
            return None
        self.num_vocoder_replays += 1
        wav = graph(batch, on_device)
        hop = wav.shape[-1] // frames
        return [wav[row, : length * hop] for row, length in enumerate(lengths)]


class _Counted:
    """A graph as solve_mels calls it, counting its evaluations."""

    def __init__(self, graph: VelocityGraph, owner: ChunkGraphs) -> None:
        self._graph, self._owner = graph, owner

    def __call__(self, time_step: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        self._owner.num_replays += 1
        return self._graph(time_step, state)
