"""integrate_rk4 (stages/qwen2_5_omni/token2wav_ode.py): the streamed chunks' ODE solve equals
transformers' RungeKutta4ODESolver.integrate(times)[-1] bit for bit, with no host sync where
transformers makes 27 a chunk, and takes transformers' path on a schedule that does not rise."""

from __future__ import annotations

import math

import pytest
import torch
from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import RungeKutta4ODESolver

from stages.qwen2_5_omni.token2wav_ode import _strictly_increasing, integrate_rk4
from tests.sync_counter import SyncCounter


def schedule(num_steps: int, sway: float | None) -> torch.Tensor:
    """solve_mels' times (as Qwen2_5OmniToken2WavDiTModel.sample builds them)."""
    times = torch.linspace(0, 1, num_steps)
    if sway is not None:
        times += sway * (torch.cos(torch.pi / 2 * times) - 1 + times)
    return times


def velocity(time_step: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
    """A nonlinear field that mixes time and state, so every RK4 stage's rounding shows."""
    return torch.sin(3 * state) * (1 + time_step) - 0.7 * state * time_step**2


@pytest.mark.parametrize(("num_steps", "sway"), [(10, -1.0), (10, None), (4, 0.3), (2, -1.0)])
def test_equals_transformers_bit_for_bit_without_syncs(num_steps, sway):
    initial = torch.randn(2, 48, 80, generator=torch.Generator().manual_seed(num_steps))
    times = schedule(num_steps, sway)
    expected = RungeKutta4ODESolver(velocity, initial).integrate(times)[-1]
    with SyncCounter({"rk4": integrate_rk4}) as counter:
        got = integrate_rk4(velocity, initial, times, num_steps, sway)
    assert torch.equal(got, expected)
    assert counter.counts.get("rk4", []) == []
    # transformers' own loop: three host comparisons per step (what integrate_rk4 leaves out)
    with SyncCounter({"solver": RungeKutta4ODESolver.integrate}) as theirs:
        RungeKutta4ODESolver(velocity, initial).integrate(times)
    assert len(theirs.counts["solver"]) >= 3 * (num_steps - 1)


def test_a_schedule_that_does_not_rise_takes_transformers_path():
    """sway 3 makes the times fall near t = 1; transformers then interpolates, and so do we."""
    num_steps, sway = 10, 3.0
    times = schedule(num_steps, sway)
    assert not bool((times[1:] > times[:-1]).all())
    assert not _strictly_increasing(num_steps, sway)  # so integrate_rk4 hands it on
    initial = torch.randn(1, 24, 80, generator=torch.Generator().manual_seed(0))
    expected = RungeKutta4ODESolver(velocity, initial).integrate(times)[-1]
    got = integrate_rk4(velocity, initial, times, num_steps, sway)
    assert torch.equal(got, expected)
    assert math.isfinite(float(got.abs().max()))
