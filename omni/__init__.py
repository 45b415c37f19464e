"""omni: multi-stage omni-model serving with paged KV caches and prefix + stage-output caching.

The torch side is imported lazily so that `import omni.core` (the bookkeeping core) and
`omni.config` stay torch-free.
"""

from typing import Any

from omni.config import ConfigError
from omni.core.sampling_params import SamplingParams

__all__ = ["AsyncOmni", "ConfigError", "Omni", "OmniOutput", "SamplingParams", "StageResult"]


def __getattr__(name: str) -> Any:
    if name == "Omni":
        from omni.entrypoints.omni import Omni

        return Omni
    if name == "AsyncOmni":
        from omni.entrypoints.async_omni import AsyncOmni

        return AsyncOmni
    if name in ("OmniOutput", "StageResult"):
        from omni import messages

        return getattr(messages, name)
    raise AttributeError(f"module 'omni' has no attribute {name!r}")
