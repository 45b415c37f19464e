"""The driver: one always-on loop per pipeline that routes every live request across its stages."""

from omni.driver.pipeline_driver import PipelineDriver, start_backend
from omni.driver.router import Router

__all__ = ["PipelineDriver", "Router", "start_backend"]
