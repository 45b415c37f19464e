"""CUDA graphs of the DiT's ODE evaluations for streamed token2wav chunks.

Why: one DiT forward of the 7B layout (22 blocks, CFG rows included) is about 900 kernels, and
a chunk's RK4 solve runs 4 * (num_steps - 1) = 36 of them, so an eager chunk is bound by
launching ~32,000 kernels from Python (on an H200, with the thinker and talker threads sharing
the GIL, first audio came 1.6 s after the talker's first code). A graph replays one whole
forward as one launch.

Shapes: a graph is fixed to (rows, frames). solve_mels pads a batch of chunks to the next
power-of-two rows and to a multiple of `frame_multiple` frames (padding sits outside every real
frame's attention, as batching already does), so the chunk sizes of a stream (the first, the
steady ones, the last) fall into a few shapes. Each shape is captured on its first use (two
warm-up forwards on a side stream, then the capture, all in one memory pool), and at most
`max_graphs` are kept, the least recently used dropped.

Buffers: each graph owns copies of its inputs. A solve copies its conditioning, rotary cos/sin,
block differences and guidance in once (`load`); each evaluation copies the time and state in,
replays, and clones the output (RK4 holds four of them at once). On the CPU (cuda_graphs true
there) the same padded shapes and buffers run eagerly: what the CPU tests check.
"""

from __future__ import annotations

import functools
import logging
import time
from collections import OrderedDict
from collections.abc import Callable

import torch

from stages.qwen2_5_omni.token2wav_chunks import dit_velocity

logger = logging.getLogger(__name__)

Shape = tuple[object, ...]  # the inputs' shapes and the autocast dtype


class VelocityGraph:
    """One (rows, frames) shape of dit_velocity: captured on a GPU, eager buffers elsewhere."""

    def __init__(
        self,
        dit: torch.nn.Module,
        inputs: tuple[torch.Tensor, ...],
        state: torch.Tensor,
        time_step: torch.Tensor,
        pool: object | None,
        autocast: torch.dtype | None = None,
    ) -> None:
        self._dit = dit
        self._autocast = autocast
        # time, state, then the solve's inputs (static, cos, sin, block_diff, guidance)
        self._buffers = [t.clone() for t in (time_step, state, *inputs)]
        self._graph: torch.cuda.CUDAGraph | None = None
        if state.device.type != "cuda":
            return
        device = state.device
        stream = torch.cuda.Stream(device=device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            for _ in range(2):  # cuBLAS picks its kernels, SDPA its backend
                dit_velocity(dit, *self._buffers, autocast=autocast)
        torch.cuda.current_stream(device).wait_stream(stream)
        self._graph = torch.cuda.CUDAGraph()
        # thread_local: the other stages' threads keep launching on their streams meanwhile.
        with torch.cuda.graph(self._graph, pool=pool, capture_error_mode="thread_local"):
            self._output = dit_velocity(dit, *self._buffers, autocast=autocast)

    def load(self, inputs: tuple[torch.Tensor, ...]) -> None:
        """A new solve's inputs, of this graph's shapes."""
        for buffer, value in zip(self._buffers[2:], inputs, strict=True):
            buffer.copy_(value)

    def __call__(self, time_step: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        self._buffers[0].copy_(time_step)
        self._buffers[1].copy_(state)
        if self._graph is None:
            return dit_velocity(self._dit, *self._buffers, autocast=self._autocast)
        self._graph.replay()
        return self._output.clone()


class VelocityGraphs:
    """The DiT's velocity graphs of one token2wav stage (solve_mels' `graphs`)."""

    def __init__(
        self,
        dit: torch.nn.Module,
        *,
        frame_multiple: int,
        max_rows: int,
        max_graphs: int = 24,
        required: bool = False,
    ) -> None:
        """frame_multiple: frames are padded to a multiple of it; max_rows: the most chunks a
        step batches (rows are padded to a power of two, at most this); required: a failed
        capture raises (else it is logged and every later solve runs eagerly)."""
        if frame_multiple < 1 or max_rows < 1 or max_graphs < 1:
            raise ValueError(
                f"frame_multiple {frame_multiple}, max_rows {max_rows} and max_graphs "
                f"{max_graphs} must be positive"
            )
        self._dit = dit
        self.frame_multiple = frame_multiple
        self.max_rows = max_rows
        self.max_graphs = max_graphs
        self._graphs: OrderedDict[Shape, VelocityGraph] = OrderedDict()
        self._pool: object | None = None
        self.required = required
        self.failure: str | None = None  # why a capture failed: eager from then on
        self.num_captures = 0
        self.num_replays = 0  # evaluations through a graph (or its eager buffers)
        self.capture_s = 0.0

    def padded_shape(self, num_frames: int, num_jobs: int) -> tuple[int, int]:
        """(frames, rows) a batch of num_jobs chunks of up to num_frames frames runs as."""
        frames = -(-num_frames // self.frame_multiple) * self.frame_multiple
        rows = 1 << (num_jobs - 1).bit_length()
        return frames, max(num_jobs, min(rows, self.max_rows))

    def velocity(
        self,
        inputs: tuple[torch.Tensor, ...],
        state: torch.Tensor,
        time_step: torch.Tensor,
        autocast: torch.dtype | None = None,
    ) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
        """The graph of these shapes and precision (captured now if new), loaded with this
        solve's inputs."""
        shape: Shape = (*(tuple(t.shape) for t in (state, *inputs)), autocast)
        graph = self._graphs.pop(shape, None)
        if graph is None and self.failure is None:
            if len(self._graphs) >= self.max_graphs:
                self._graphs.popitem(last=False)
            try:
                graph = self._capture(inputs, state, time_step, autocast)
            except Exception as e:
                if self.required:
                    raise
                self.failure = f"{type(e).__name__}: {e}"
                logger.warning("token2wav: DiT capture failed, eager from now on (%s)", e)
        if graph is None:
            return functools.partial(_eager, self._dit, inputs, autocast)
        self._graphs[shape] = graph  # the most recently used last
        graph.load(inputs)
        return _Counted(graph, self)

    def _capture(
        self,
        inputs: tuple[torch.Tensor, ...],
        state: torch.Tensor,
        time_step: torch.Tensor,
        autocast: torch.dtype | None,
    ) -> VelocityGraph:
        start = time.perf_counter()
        on_gpu = state.device.type == "cuda"
        if on_gpu and self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = VelocityGraph(self._dit, inputs, state, time_step, self._pool, autocast)
        if on_gpu:
            torch.cuda.synchronize(state.device)
        elapsed = time.perf_counter() - start
        self.capture_s += elapsed
        self.num_captures += 1
        logger.info(
            "token2wav: DiT velocity for %d rows x %d frames %s in %.0f ms (%d shapes kept)",
            state.shape[0],
            state.shape[1],
            "captured" if on_gpu else "buffered (eager)",
            elapsed * 1e3,
            len(self._graphs) + 1,
        )
        return graph

    @property
    def num_graphs(self) -> int:
        return len(self._graphs)


def _eager(
    dit: torch.nn.Module,
    inputs: tuple[torch.Tensor, ...],
    autocast: torch.dtype | None,
    time: torch.Tensor,
    state: torch.Tensor,
) -> torch.Tensor:
    return dit_velocity(dit, time, state, *inputs, autocast=autocast)


class _Counted:
    """A graph as solve_mels calls it, counting its evaluations."""

    def __init__(self, graph: VelocityGraph, owner: VelocityGraphs) -> None:
        self._graph, self._owner = graph, owner

    def __call__(self, time_step: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        self._owner.num_replays += 1
        return self._graph(time_step, state)
