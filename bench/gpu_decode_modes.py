"""The omni passes of the decode part: CUDA graphs on (True), off (False), on with
engine.async_scheduling ("ahead": each decode step launched before the previous one's ids are
read), and "processes": ahead with the stage in a process of its own (runtime.backend
processes), so that its steps do not share a GIL with the driver and the caller's event loop."""

from __future__ import annotations

from typing import Literal

Mode = bool | Literal["ahead", "processes"]


def mode_label(mode: Mode) -> str:
    labels = {True: "graphs on", False: "graphs off", "ahead": "graphs on, async"}
    return labels.get(mode, "graphs on, async, stage process")  # type: ignore[call-overload]
