"""Backends move messages between the driver and the stage hosts: in-process (local) or Ray actors."""

from omni.backends.backend import StageBackend

__all__ = ["StageBackend"]
