"""The device plan: which stages run on a GPU, the fraction of one each takes and its memory
share, decided before anything loads. Torch-free: the caller passes the number of GPUs (the local
backend asks torch, the Ray backend counts the cluster's, `omni validate` the machine's), so the
plan and its tests need no GPU.

Rules (docs/gpu.md, "Config fields"):
- `resources.num_gpus` 0: no GPU (device auto runs on the CPU; on Ray the actor starts with an
  empty CUDA_VISIBLE_DEVICES). > 0: the GPU, or fraction of one, the stage takes. null: planned.
  Without GPUs it is 0. With GPUs, each stage not pinned to the CPU takes `resources.gpu_share`,
  else the fraction its own `gpu_memory_utilization` implies (share / 0.9), else 0.1 for a
  generation stage (a vocoder sizes no pool from its share: a small fixed one leaves the rest to
  the KV pools), and the ar stages split what is left of one GPU equally. On the local and
  processes backends the planned stages share cuda:0 with every other GPU stage, and on Ray
  with one GPU too (a stage taking the whole GPU leaves them none: a ConfigError).
- `device: cuda` needs a GPU: num_gpus 0 contradicts it, and the machine or cluster must have one.
- `gpu_memory_utilization` null: 0.9 of the stage's fraction (0.9 of a GPU for whole GPUs).
- Memory shares on one GPU sum to at most 0.95 (the rest is for CUDA contexts and fragmentation).
  On the local and processes backends every GPU stage is on cuda:0. On Ray a stage's share may
  not exceed its fraction, and no set of fractional stages Ray may put on one GPU (fractions
  summing to at most 1) may sum above 0.95.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from omni.config.schema import ConfigError, OmniConfig, StageConfig
from omni.config.validate import config_error

DEFAULT_UTILIZATION = 0.9  # of the stage's GPU (fraction): the rest is CUDA's and fragmentation's
MAX_UTILIZATION_PER_GPU = 0.95  # the most the memory shares on one GPU may sum to
GENERATION_SHARE = 0.1  # of a GPU, for a planned generation stage that declares no gpu_share
_EPS = 1e-6
logger = logging.getLogger(__name__)
_Placed = tuple[StageConfig, StageConfig]  # a stage as given and as placed


@dataclass(frozen=True)
class StagePlan:
    """Where one stage runs, as `omni validate` prints it."""

    name: str
    """The stage."""
    device: str
    """cpu or cuda."""
    num_gpus: float
    """The GPU (fraction) it takes; 0 on the CPU."""
    planned: bool
    """num_gpus was null and came from the plan."""
    gpu_memory_utilization: float | None
    """Its memory share of the GPU; None on the CPU."""
    dtype: str
    """The dtype it runs in."""


def memory_share(fraction: float | None) -> float:
    """The default gpu_memory_utilization of a stage taking `fraction` of a GPU: 0.9 of it, or
    0.9 of one GPU for a whole GPU or more (or no fraction known)."""
    f = fraction or 0.0
    return DEFAULT_UTILIZATION * f if 0 < f < 1 else DEFAULT_UTILIZATION


def plan_gpus(config: OmniConfig, *, num_gpus: float, what: str) -> OmniConfig:
    """The config with every stage placed: resources.num_gpus resolved, a CPU stage's device set
    to cpu, a GPU stage's gpu_memory_utilization resolved. num_gpus: the GPUs there are (local:
    torch's; Ray: the cluster's). A ConfigError naming the stage and the field when a stage cannot
    have the GPU it asks for, or shares on one GPU sum above 0.95. `what`: the machine or
    cluster, for the message (e.g. "this machine has no CUDA GPU")."""
    backend = config.runtime.backend
    for stage in config.stages:
        _check_request(stage, num_gpus, what)
    fractions = _fractions(config.stages, backend, num_gpus)
    placed = [_place(s, fractions[s.name], num_gpus) for s in config.stages]
    for stage in placed:
        f = stage.resources.num_gpus or 0.0
        if f > 1 and _gpu(stage):
            logger.warning(
                "stages.%s.resources.num_gpus=%g reserves %g GPUs, but the stage computes on "
                "one (omni has no tensor parallelism); the others sit idle",
                stage.name, f, f,
            )  # fmt: skip
    _check_shares([(s, p) for s, p in zip(config.stages, placed, strict=True) if _gpu(p)], backend)
    return dataclasses.replace(config, stages=tuple(placed))


def describe_plan(config: OmniConfig, planned: OmniConfig) -> list[StagePlan]:
    """Each stage of `planned` (plan_gpus of `config`), in topological order."""
    plans = []
    for name in planned.topological_order():
        stage, before = planned.stage(name), config.stage(name).resources.num_gpus
        gpu = _gpu(stage)
        dtype = "float32" if stage.kind == "generation" else stage.engine.resolved_dtype(gpu)
        plans.append(
            StagePlan(
                name=name,
                device="cuda" if gpu else "cpu",
                num_gpus=stage.resources.num_gpus or 0.0,
                planned=before is None,
                gpu_memory_utilization=stage.engine.gpu_memory_utilization if gpu else None,
                dtype=dtype,
            )
        )
    return plans


def _gpu(placed: StageConfig) -> bool:
    """Whether a placed stage (plan_gpus) runs on a GPU: its device is no longer auto-to-cpu."""
    return placed.engine.device != "cpu"


def _check_request(stage: StageConfig, num_gpus: float, what: str) -> None:
    if stage.engine.device != "cuda":
        return
    if stage.resources.num_gpus == 0:
        raise config_error(
            f"stages.{stage.name}.resources.num_gpus",
            "is 0 (no GPU), but engine.device is cuda: give the stage a GPU (a fraction such as "
            "0.5 shares one) or leave num_gpus null to plan it",
        )
    if num_gpus <= 0:
        raise config_error(
            f"stages.{stage.name}.engine.device", f"is cuda, but {what}; use cpu or auto"
        )


def _fractions(stages: tuple[StageConfig, ...], backend: str, num_gpus: float) -> dict[str, float]:
    """Each stage's GPU fraction: its num_gpus, or the planned one when that is null."""
    out: dict[str, float] = {}
    to_plan: list[StageConfig] = []
    for s in stages:
        if s.resources.num_gpus is not None:
            out[s.name] = s.resources.num_gpus  # on Ray a CPU stage may still reserve a GPU
        elif s.engine.device == "cpu" or num_gpus <= 0:
            out[s.name] = 0.0
        else:
            to_plan.append(s)
    if not to_plan:
        return out
    # What the planned stages share their GPU with: on the local backend and on Ray with one GPU,
    # every GPU stage (a whole-GPU one leaves them nothing). On a larger cluster Ray places them,
    # and _check_shares catches the sets that would not fit.
    terms: dict[str, tuple[float, str]] = {}
    for s in stages:
        f = out.get(s.name, 0.0)
        if s.engine.device != "cpu" and f > 0 and (backend != "ray" or num_gpus < 2):
            terms[s.name] = (min(f, 1.0), f"stages.{s.name}.resources.num_gpus={f:g}")
    for s in to_plan:
        share, used = s.resources.gpu_share, s.engine.gpu_memory_utilization
        if share is not None:
            terms[s.name] = (share, f"stages.{s.name}.resources.gpu_share={share:g}")
        elif used is not None:
            implied = min(used / DEFAULT_UTILIZATION, 1.0)
            where = f"stages.{s.name}.engine.gpu_memory_utilization={used:g}"
            terms[s.name] = (implied, f"{implied:.3g} from {where} / {DEFAULT_UTILIZATION:g}")
        elif s.kind == "generation":
            why = f"stages.{s.name}: {GENERATION_SHARE:g} (a generation stage's default)"
            terms[s.name] = (GENERATION_SHARE, why)
    taken = sum(f for f, _ in terms.values())
    if taken > 1 + _EPS:
        listed = ", ".join(why for _, why in terms.values())
        raise ConfigError(
            f"the stages sharing one GPU take {taken:.3g} of it (> 1): {listed}; lower them, or "
            "set resources.num_gpus"
        )
    split = [s.name for s in to_plan if s.name not in terms]
    left = 1.0 - taken
    if split and left <= _EPS:
        listed = ", ".join(why for _, why in terms.values())
        raise config_error(
            f"stages.{split[0]}.resources.num_gpus",
            f"null, but nothing is left of the GPU to plan it ({listed}): set it or "
            "resources.gpu_share",
        )
    for s in to_plan:
        out[s.name] = terms[s.name][0] if s.name in terms else left / len(split)
    return out


def _place(stage: StageConfig, fraction: float, num_gpus: float) -> StageConfig:
    resources = dataclasses.replace(stage.resources, num_gpus=fraction)
    if stage.engine.device != "cpu" and fraction > 0 and num_gpus > 0:
        used = stage.engine.gpu_memory_utilization
        share = memory_share(fraction) if used is None else used
        engine = dataclasses.replace(stage.engine, gpu_memory_utilization=share)
    else:  # auto without a GPU for the stage: the CPU, whatever the process sees
        engine = dataclasses.replace(stage.engine, device="cpu")
    return dataclasses.replace(stage, resources=resources, engine=engine)


def _check_shares(stages: list[_Placed], backend: str) -> None:
    """(as given, placed) GPU stages: ConfigError for a share above a Ray fraction, or shares that
    may end up on one GPU summing above MAX_UTILIZATION_PER_GPU."""
    if backend != "ray":
        _check_sum(stages, f"on the {backend} backend every GPU stage runs on cuda:0")
        return
    fractional = []
    for given, placed in stages:
        fraction, share = placed.resources.num_gpus or 0.0, placed.engine.gpu_memory_utilization
        assert share is not None  # _place resolved it
        if fraction < 1 and share > fraction + _EPS:
            raise config_error(
                f"stages.{placed.name}.engine.gpu_memory_utilization",
                f"{share:g} is more than the {fraction:g} GPU the stage takes "
                f"(resources.num_gpus); stages sharing a GPU must not sum above 1",
            )
        if fraction < 1:  # each replica is an actor of its own that Ray may put beside others
            fractional.extend([(given, placed)] * placed.resources.replicas)
        else:
            _check_sum([(given, placed)], "the stage has its GPU to itself")
    # Ray may put any set of fractional stages whose fractions sum to <= 1 on one GPU: the set
    # with the largest memory shares must fit (stage counts are small: every subset is tried).
    worst: tuple[_Placed, ...] = ()
    for size in range(1, len(fractional) + 1):
        for group in itertools.combinations(fractional, size):
            fits = sum(p.resources.num_gpus or 0.0 for _, p in group) <= 1 + _EPS
            if fits and _total(group) > _total(worst):
                worst = group
    _check_sum(worst, "Ray may put these fractions on one GPU")


def _total(group: Sequence[_Placed]) -> float:
    return sum(p.engine.gpu_memory_utilization or 0.0 for _, p in group)


def _check_sum(group: Sequence[_Placed], why: str) -> None:
    total = _total(group)
    if total <= MAX_UTILIZATION_PER_GPU + _EPS:
        return
    terms = []
    for given, placed in group:
        share = placed.engine.gpu_memory_utilization or 0.0
        term = f"stages.{placed.name}.engine.gpu_memory_utilization={share:.3g}"
        if given.engine.gpu_memory_utilization is None:
            f = placed.resources.num_gpus or 0.0
            source = "planned " if given.resources.num_gpus is None else ""
            term += f" (0.9 x {source}resources.num_gpus={f:.3g})" if f < 1 else " (0.9 x 1)"
        terms.append(term)
    raise ConfigError(
        f"GPU memory shares sum to {total:.3g} on one GPU ({why}), above "
        f"{MAX_UTILIZATION_PER_GPU:g} (the rest is for CUDA contexts and fragmentation): "
        f"{', '.join(terms)}; lower them"
    )
