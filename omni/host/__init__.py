"""The stage host: one stage's engine, input processing and loop, for every backend."""

from omni.host.stage_host import Processor, StageHost

__all__ = ["Processor", "StageHost"]
