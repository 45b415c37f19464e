"""Which stages run on a GPU and how much of it each may use, checked before anything loads.

Torch-free: the caller says whether CUDA is there (the local backend asks torch; the Ray backend
counts the cluster's GPUs), so `omni validate` and the unit tests need no GPU.

Rules:
- `device: cuda` needs a GPU: a local run needs torch to see one; on Ray the stage must reserve
  one (`resources.num_gpus` > 0, a fraction shares a GPU) and the cluster must have GPUs.
- Local backend: every GPU stage runs on the one GPU torch sees, so the shares its GPU stages
  give in `gpu_memory_utilization` must sum to at most 1; stages that leave it null split what
  is left of 0.9 equally.
- Ray: a stage's GPUs are its own, shared only as Ray's fractions say, so its share may not exceed
  a fractional `resources.num_gpus` (then GPU stages on one GPU never sum above 1); null means
  that fraction, or 0.9 of a whole GPU.
"""

from __future__ import annotations

import dataclasses

from omni.config.schema import OmniConfig, StageConfig
from omni.config.validate import config_error

DEFAULT_UTILIZATION = 0.9  # of a whole GPU: the rest is left to CUDA's context and fragmentation
_EPS = 1e-6


def on_gpu(stage: StageConfig, backend: str, cuda_available: bool) -> bool:
    """Whether the stage will run on a GPU (device cuda, or auto with one available to it)."""
    if stage.engine.device == "cpu":
        return False
    if backend == "ray" and stage.resources.num_gpus <= 0:
        return False  # Ray hides every GPU from an actor that reserved none
    return stage.engine.device == "cuda" or cuda_available


def plan_gpus(config: OmniConfig, *, cuda_available: bool, what: str) -> OmniConfig:
    """The config with every GPU stage's gpu_memory_utilization resolved; a ConfigError naming
    the stage and the field when a stage cannot have the GPU it asks for. `what`: the machine
    or cluster, for the message (e.g. "this machine has no CUDA GPU")."""
    backend = config.runtime.backend
    gpu_stages = []
    for stage in config.stages:
        engine, field = stage.engine, f"stages.{stage.name}.engine"
        if engine.device == "cuda" and backend == "ray" and stage.resources.num_gpus <= 0:
            raise config_error(
                f"stages.{stage.name}.resources.num_gpus",
                "device cuda on Ray needs a GPU reserved for the stage: set num_gpus > 0 "
                "(a fraction such as 0.5 shares a GPU)",
            )
        if engine.device == "cuda" and not cuda_available:
            raise config_error(f"{field}.device", f"is cuda, but {what}; use cpu or auto")
        if on_gpu(stage, backend, cuda_available):
            gpu_stages.append(stage)
        fraction = stage.resources.num_gpus
        share = engine.gpu_memory_utilization
        if backend == "ray" and share is not None and 0 < fraction < 1 and share > fraction + _EPS:
            raise config_error(
                f"{field}.gpu_memory_utilization",
                f"{share:g} is more than the {fraction:g} GPU the stage reserves "
                f"(resources.num_gpus); stages sharing a GPU must not sum above 1",
            )
    shares = _shares(gpu_stages, backend)
    stages = tuple(
        dataclasses.replace(
            s, engine=dataclasses.replace(s.engine, gpu_memory_utilization=shares[s.name])
        )
        if s.name in shares
        else s
        for s in config.stages
    )
    return dataclasses.replace(config, stages=stages)


def _shares(stages: list[StageConfig], backend: str) -> dict[str, float]:
    if backend == "ray":
        return {
            s.name: s.engine.gpu_memory_utilization
            or (s.resources.num_gpus if s.resources.num_gpus < 1 else DEFAULT_UTILIZATION)
            for s in stages
        }
    given = {s.name: s.engine.gpu_memory_utilization for s in stages}
    explicit = sum(v for v in given.values() if v is not None)
    if explicit > 1 + _EPS:
        listed = ", ".join(f"{n}={v:g}" for n, v in given.items() if v is not None)
        raise config_error(
            "engine.gpu_memory_utilization",
            f"the GPU stages share one GPU on the local backend, but their shares sum to "
            f"{explicit:g} > 1 ({listed})",
        )
    unset = [n for n, v in given.items() if v is None]
    rest = max(DEFAULT_UTILIZATION - explicit, 0.0)
    if unset and rest <= _EPS:
        raise config_error(
            f"stages.{unset[0]}.engine.gpu_memory_utilization",
            f"nothing is left of the GPU ({explicit:g} given to the others): set it",
        )
    return {n: (v if v is not None else rest / len(unset)) for n, v in given.items()}
