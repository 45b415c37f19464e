"""The omni passes of the decode part: CUDA graphs on (True), off (False), and on with
engine.async_scheduling ("ahead": each decode step launched before the previous one's ids are
read)."""

from __future__ import annotations

from typing import Literal

Mode = bool | Literal["ahead"]


def mode_label(mode: Mode) -> str:
    return {True: "graphs on", False: "graphs off", "ahead": "graphs on, async"}[mode]
