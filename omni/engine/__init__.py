"""Stage engines: StageEngine (autoregressive: paged KV cache, prefix and output caching) and
GenerationEngine (one-shot, e.g. a vocoder), both behind the `Engine` contract."""

from omni.config import StageConfig
from omni.engine.engine import DTYPES, Engine
from omni.engine.generation_engine import GenerationEngine
from omni.engine.stage_engine import StageEngine

__all__ = ["DTYPES", "Engine", "GenerationEngine", "StageEngine", "create_engine"]


def create_engine(config: StageConfig) -> Engine:
    """The engine for a stage's kind: autoregressive (paged KV, prefix caching) or generation."""
    if config.kind == "generation":
        return GenerationEngine(config)
    return StageEngine(config)
