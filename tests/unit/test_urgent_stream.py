"""urgent_stream (omni/engine/device.py): a stream of its own only for urgent work on a GPU; on
the CPU, or when not urgent, nothing about streams is touched (tests/cuda checks the GPU side)."""

from __future__ import annotations

import pytest
import torch

from omni.engine import device as device_module
from omni.engine.device import urgent_stream


@pytest.mark.parametrize(
    ("device", "urgent"), [("cpu", True), ("cpu", False), ("cuda", False)], ids=str
)
def test_no_stream_unless_urgent_on_a_gpu(device, urgent, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a CUDA stream was asked for")

    monkeypatch.setattr(torch.cuda, "Stream", refuse)
    monkeypatch.setattr(torch.cuda, "current_stream", refuse)
    ran = []
    with urgent_stream(torch.device(device), urgent):
        ran.append(True)
    assert ran == [True] and not device_module._urgent_streams


def test_urgent_outranks_the_ar_stages():
    assert device_module.stream_priority("ar") > device_module.URGENT_PRIORITY
    assert device_module.stream_priority("ar") < device_module.stream_priority("generation")
