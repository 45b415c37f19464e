"""The streamed chunks' ODE solve: transformers' RK4 (Qwen2_5OmniToken2WavDiTModel.sample's
RungeKutta4ODESolver) by its own step, with the host kept out of the GPU's way.

Why not `RungeKutta4ODESolver.integrate`: it compares time tensors on the host three times a
step (27 syncs a chunk of 10 time points). Each drains the GPU, which then idles until the
chunk's thread, sharing the GIL with the thinker's and talker's, launches the next evaluation.
On a strictly increasing schedule (solve_mels' always is, for the sway coefficients in use) each
step ends on the next time point, where its interpolation returns the step's value as it is; so
adding each step's delta in turn is the same arithmetic. Any other schedule takes transformers'
path.

Queue depth: without the syncs a chunk's 36 evaluations (thousands of kernels) would all be
queued at once, and another stage's device-wide barrier (a pinned or device allocation waits for
every stream; measured on an H200: a talker step stalled 145 ms once per request) would wait
for all of them. So at most QUEUED_STEPS steps stay queued: the host waits on the event of an
older step, never on the GPU going idle.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections import deque
from collections.abc import Callable

import torch
from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import RungeKutta4ODESolver

QUEUED_STEPS = 2  # RK4 steps (4 DiT evaluations each) a chunk may have queued on the GPU


def integrate_rk4(
    velocity: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    initial: torch.Tensor,
    times: torch.Tensor,
    num_steps: int,
    sway_coefficient: float | None,
) -> torch.Tensor:
    """`RungeKutta4ODESolver(velocity, initial).integrate(times)[-1]`, without host syncs."""
    solver = RungeKutta4ODESolver(function=velocity, initial_value=initial)
    if not _strictly_increasing(num_steps, sway_coefficient):
        return solver.integrate(times)[-1]
    value, queued = initial, deque[torch.cuda.Event]()
    for start, end in zip(times[:-1], times[1:], strict=True):
        value = value + solver._compute_step(velocity, start, end - start, end, value)[0]
        if value.is_cuda:
            queued.append(torch.cuda.Event())
            queued[-1].record()
            if len(queued) > QUEUED_STEPS:
                queued.popleft().synchronize()  # an older step's end: the GPU still has work
    return value


@functools.cache
def _strictly_increasing(num_steps: int, sway_coefficient: float | None) -> bool:
    """Whether solve_mels' time schedule rises at every point (host float64, wide margin)."""
    times = [i / max(num_steps - 1, 1) for i in range(num_steps)]
    if sway_coefficient is not None:
        times = [t + sway_coefficient * (math.cos(math.pi / 2 * t) - 1 + t) for t in times]
    return all(later - earlier > 1e-5 for earlier, later in itertools.pairwise(times))
