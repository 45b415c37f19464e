"""Stage-config schema: frozen dataclasses, one docstring per field. A stage's engine settings
(EngineConfig, StreamConfig) are in omni/config/engine_config.py and re-exported here.

Every value is checked when a dataclass is built, so a config that loads is one the runtime can
trust; `load_config` (omni/config/load.py) adds what only the whole file knows (key paths,
variables, model paths, overrides, defaults from the checkpoint). Torch-free: `omni validate`
imports this without any model code.

Relative `model` paths written in a YAML file resolve against the YAML file's directory (so a
config can sit next to its checkpoints); a value that starts with a variable (`${MODEL}/talker`)
and every path in a dict source or an override resolve against the current working directory.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any

from omni.config.engine_config import EngineConfig, StreamConfig
from omni.config.validate import (
    STAGE_NAME,
    FieldError,
    check_types,
    config_error,
    one_of,
    require,
    stage_order,
    suggest,
)
from omni.config.validate import ConfigError as ConfigError  # re-exported: callers catch it
from omni.config.validate import check_resources as check_resources  # re-exported
from omni.core.sampling_params import SamplingParams
from omni.registry import (
    ADAPTER_KINDS,
    EDGE_STREAMING,
    get_adapter_spec,
    get_edge_streaming,
    known_adapters,
    known_input_processors,
)

KINDS = ADAPTER_KINDS
BACKENDS = ("ray", "local", "processes")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
PLACEMENTS = ("none", "pack", "spread")
REPLICA_ROUTINGS = ("cache_aware", "least_loaded", "round_robin")
RETURN_TENSORS = ("final", "all")
STAGE_THREADS = ("auto", "shared", "per_stage")
STAGE_CONFIG_DIR = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "stage_configs"
)
"""Where the families' pipelines live (stage_configs/<ModelFamily.stage_config>.yaml): the folder
beside the omni package, the project's top level in a checkout, site-packages in a wheel install
(pyproject.toml ships it as the data package `stage_configs`)."""


@dataclass(frozen=True)
class ResourcesConfig:
    """What the stage's Ray actor reserves on its node."""

    num_cpus: float = 1.0
    """CPUs reserved for the actor (fractions allowed, e.g. 0.5 to share a core)."""
    num_gpus: float | None = None
    """GPUs the stage takes (on Ray, reserves for its actor): 0 none (the CPU), a fraction such
    as 0.5 shares one, above 1 reserves more but computes on one (a warning); null is planned
    from the machine or cluster: none without GPUs, else gpu_share (omni/config/devices.py)."""
    gpu_share: float | None = None
    """The fraction of a GPU (0 < x <= 1) a stage whose num_gpus is null takes when there are
    GPUs; null: 0.1 for a generation stage, and the ar stages split what is left of one GPU."""
    custom: dict[str, float] = field(default_factory=dict)
    """Ray custom resources, e.g. {node_a: 1} to pin the stage to a labelled node."""
    replicas: int = 1
    """Copies of the stage (ray backend), each its own actor with its own caches and all of the
    resources above; requests are spread over them by runtime.replica_routing."""

    def __post_init__(self) -> None:
        check_types(self)
        require(self.num_cpus >= 0, self, "num_cpus", ">= 0")
        require(self.num_gpus is None or self.num_gpus >= 0, self, "num_gpus", ">= 0 or null")
        share = self.gpu_share
        require(share is None or 0 < share <= 1, self, "gpu_share", "in (0, 1] or null")
        require(self.replicas >= 1, self, "replicas", "an integer >= 1")
        for key, amount in self.custom.items():
            require(amount >= 0, self, f"custom.{key}", ">= 0", amount)
            # Ray refuses these as custom resource names; point at the real fields instead.
            require(key not in ("CPU", "GPU"), self, f"custom.{key}", "num_cpus/num_gpus", amount)

    def as_ray_resources(self) -> dict[str, float]:
        """Non-zero requests keyed as Ray reports node resources (CPU, GPU, custom names); a
        null num_gpus (not planned yet, see omni/config/devices.py) requests no GPU."""
        wanted = {"CPU": self.num_cpus, "GPU": self.num_gpus or 0.0, **self.custom}
        return {k: v for k, v in wanted.items() if v > 0}


@dataclass(frozen=True)
class StageConfig:
    """One stage of the pipeline: a model in its own actor with its own engine."""

    name: str
    """Unique stage name; other stages list it in `inputs`, overrides address it."""
    model: str
    """Checkpoint directory (HF format, contains config.json)."""
    kind: str = "ar"
    """ar (autoregressive, KV cache) or generation (one-shot, e.g. a vocoder)."""
    adapter: str = "causal_lm"
    """Stage model adapter (declared by a model family, omni/family.py) that loads and runs the model."""
    inputs: tuple[str, ...] = ()
    """Upstream stage names; empty for a root stage, which receives the user's prompts."""
    input_processor: str | None = None
    """Registered function turning upstream outputs into this stage's input; null for a root."""
    engine: EngineConfig = field(default_factory=EngineConfig)
    """KV cache, scheduler and numerics of this stage."""
    resources: ResourcesConfig = field(default_factory=ResourcesConfig)
    """What this stage's actor reserves."""
    sampling: SamplingParams = field(default_factory=SamplingParams)
    """Default sampling for this stage when a request brings none."""
    stream: StreamConfig = field(default_factory=StreamConfig)
    """Streaming input (start before the upstream finished) and output chunks."""

    def __post_init__(self) -> None:
        check_types(self)
        rule = "letters, digits, _ and - (no dots), not starting with a digit"
        require(bool(STAGE_NAME.match(self.name)), self, "name", rule)
        require(bool(self.model), self, "model", "a checkpoint directory")
        require(self.kind in KINDS, self, "kind", one_of(KINDS))
        require(self.adapter in known_adapters(), self, "adapter", one_of(known_adapters()))
        spec = get_adapter_spec(self.adapter)
        if self.kind != spec.kind:  # the engine is picked by kind, the model by adapter
            article = "an ar" if spec.kind == "ar" else f"a {spec.kind}"
            raise FieldError(
                type(self).__name__,
                "kind",
                f"got {self.kind!r}, but adapter {self.adapter!r} is {article} adapter: "
                f"set kind: {spec.kind}",
            )
        inputs = list(self.inputs)
        require(self.name not in inputs, self, "inputs", "other stages than itself", inputs)
        require(len(set(inputs)) == len(inputs), self, "inputs", "without repeats", inputs)
        if not inputs:
            require(self.input_processor is None, self, "input_processor", "null for a root stage")
        else:
            known = known_input_processors()
            expected = "set for a stage with inputs, " + (one_of(known) if known else "none known")
            require(self.input_processor in known, self, "input_processor", expected)
        if self.stream.enabled:
            streams = get_edge_streaming(self.input_processor) is not None and len(inputs) == 1
            expected = "a stage with one input whose input_processor can stream, one of " + str(
                sorted(EDGE_STREAMING)
            )
            require(streams, self, "stream.enabled", expected, self.input_processor)

    @property
    def num_threads(self) -> int:
        """Torch threads for this stage: engine.num_threads, else the reserved CPUs (at least 1)."""
        if self.engine.num_threads is not None:
            return self.engine.num_threads
        return max(1, int(self.resources.num_cpus))


@dataclass(frozen=True)
class RuntimeConfig:
    """Where and how the stage actors run."""

    backend: str = "ray"
    """ray (a Ray actor per stage), local (all in this process), processes (one process each)."""
    address: str | None = None
    """An existing Ray cluster, e.g. auto or ray://head:10001; null starts a local one."""
    num_cpus: int | None = None
    """CPUs given to a locally started Ray; null lets Ray count them."""
    request_timeout_s: float = 600.0
    """Longest wait for any single stage result before the request fails."""
    log_level: str = "INFO"
    """Logging level of the driver and the actors: DEBUG, INFO, WARNING, ERROR or CRITICAL."""
    max_stage_restarts: int = 1
    """How often the ray (per replica) or processes backend replaces a dead stage's process."""
    placement: str = "none"
    """none (Ray places each actor), pack or spread (one placement group, a bundle per replica)."""
    replica_routing: str = "cache_aware"
    """Which replica of a stage takes a request: cache_aware (the one that saw its prefix,
    unless much busier than the least-loaded), least_loaded or round_robin."""
    return_tensors: str = "final"
    """final (only the final stage's tensors reach the caller; the others' go stage to stage and
    never through the driver) or all (every stage's result with its tensors, fetched)."""
    stage_threads: str = "auto"
    """Local backend: auto (each stage on a GPU steps on its own thread, the CPU stages share
    one), shared (one thread steps every stage) or per_stage (a thread per stage)."""
    stage_streams: bool | None = None
    """Local backend: a GPU stage on a thread of its own launches on a CUDA stream of its own, so
    its kernels never queue behind another stage's; null means on unless a stage keeps its
    output cache on the GPU (then stage-to-stage tensors would cross streams)."""

    def __post_init__(self) -> None:
        check_types(self)
        require(self.backend in BACKENDS, self, "backend", one_of(BACKENDS))
        require(self.num_cpus is None or self.num_cpus >= 1, self, "num_cpus", ">= 1 or null")
        require(self.request_timeout_s > 0, self, "request_timeout_s", "> 0")
        require(self.max_stage_restarts >= 0, self, "max_stage_restarts", "an integer >= 0")
        require(self.log_level.upper() in LOG_LEVELS, self, "log_level", one_of(LOG_LEVELS))
        require(self.placement in PLACEMENTS, self, "placement", one_of(PLACEMENTS))
        routings = REPLICA_ROUTINGS
        require(self.replica_routing in routings, self, "replica_routing", one_of(routings))
        require(
            self.return_tensors in RETURN_TENSORS, self, "return_tensors", one_of(RETURN_TENSORS)
        )
        require(self.stage_threads in STAGE_THREADS, self, "stage_threads", one_of(STAGE_THREADS))
        object.__setattr__(self, "log_level", self.log_level.upper())


@dataclass(frozen=True)
class OmniConfig:
    """A whole pipeline: a DAG of stages with exactly one final stage, plus the runtime."""

    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    """Where and how the stage actors run."""
    stages: tuple[StageConfig, ...] = ()
    """The stages in any order; the edges come from each stage's `inputs`."""

    def __post_init__(self) -> None:
        try:
            check_types(self)
        except FieldError as e:
            raise config_error(e.field, e.message) from None
        if not self.stages:
            raise config_error("stages", "must list at least one stage, got []")
        names = self.stage_names
        for name in names:
            if names.count(name) > 1:
                raise config_error("stages", f"duplicate stage name {name!r}")
        stage_order(self._graph)
        on_gpu_cache = [s.name for s in self.stages if s.engine.output_cache_device == "cuda"]
        if self.runtime.stage_streams and on_gpu_cache:
            raise config_error(
                "runtime.stage_streams",
                f"is true, but stages {on_gpu_cache} keep their output cache on the GPU "
                "(engine.output_cache_device: cuda): their tensors would cross CUDA streams; "
                "leave it null or set output_cache_device: cpu",
            )
        if self.runtime.backend != "ray":
            for stage in self.stages:
                if stage.resources.replicas > 1:
                    raise config_error(
                        f"stages.{stage.name}.resources.replicas",
                        f"is {stage.resources.replicas}, but replicas need runtime.backend ray "
                        f"(got {self.runtime.backend!r}), which runs one copy",
                    )

    @property
    def own_streams(self) -> bool:
        """Whether a local GPU stage on its own thread gets a CUDA stream of its own."""
        if self.runtime.stage_streams is not None:
            return self.runtime.stage_streams
        return all(s.engine.output_cache_device != "cuda" for s in self.stages)

    def stage(self, name: str) -> StageConfig:
        """The stage called `name`."""
        for stage in self.stages:
            if stage.name == name:
                return stage
        raise ValueError(f"no stage named {name!r}{suggest(name, self.stage_names)}")

    @property
    def stage_names(self) -> list[str]:
        """Stage names in config order."""
        return [s.name for s in self.stages]

    @property
    def root_stages(self) -> tuple[StageConfig, ...]:
        """Stages with no inputs: each receives every user prompt."""
        return tuple(s for s in self.stages if not s.inputs)

    @property
    def final_stage(self) -> StageConfig:
        """The single stage no other stage consumes (load-time checks guarantee exactly one)."""
        return next(s for s in self.stages if not self.consumers(s.name))

    def consumers(self, name: str) -> tuple[StageConfig, ...]:
        """Stages that list `name` in their inputs."""
        return tuple(s for s in self.stages if name in s.inputs)

    def topological_order(self) -> list[str]:
        """Stage names, every stage after all its inputs; ties keep config order."""
        return stage_order(self._graph)

    @property
    def _graph(self) -> dict[str, tuple[str, ...]]:
        return {s.name: s.inputs for s in self.stages}

    def to_dict(self) -> dict[str, Any]:
        """Plain data (lists, not tuples) that load_config accepts and yaml.safe_dump writes."""
        return _plain(dataclasses.asdict(self))


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value
