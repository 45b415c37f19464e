"""omni: multi-stage omni-model serving with paged KV caches and prefix + stage-output caching.

The torch side is imported lazily so that `import omni.core` (the bookkeeping core) and
`omni.config` stay torch-free.
"""

from omni.core.sampling_params import SamplingParams

__all__ = ["Omni", "OmniOutput", "SamplingParams", "StageResult"]


def __getattr__(name: str):
    if name == "Omni":
        from omni.pipeline import Omni

        return Omni
    if name in ("OmniOutput", "StageResult"):
        from omni import outputs

        return getattr(outputs, name)
    raise AttributeError(f"module 'omni' has no attribute {name!r}")
