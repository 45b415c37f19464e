"""The Ray backend: one StageActor per stage, placed by its config's resources.

Connection (RaySession): an already initialized Ray is used as it is and left running;
`runtime.address` is connected to and disconnected from on shutdown; otherwise a private local
Ray instance is started (ENV-FACTS settings: no dashboard, no auth token, no usage stats, a
temp dir of its own under /tmp) and shut down, with all its processes, by `shutdown`.

Waiting (RayBackend.poll): every actor always has one outstanding `poll` call; the driver waits
on all of them (and on its own submit calls) at once with `ray.wait`. A dead actor makes its
outstanding call fail at once, so a killed stage surfaces within seconds as a RuntimeError that
names it, never as a hang. "No progress for runtime.request_timeout_s" is the router's check.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
import time
from typing import Any

import ray

from omni.config import OmniConfig, RuntimeConfig, check_resources
from omni.outputs import StageInput, StageResult
from omni.stage_client import Finished, Processor, RoutedInput
from omni.transport import pack_input, unpack_result

logger = logging.getLogger(__name__)

ACTOR_POLL_S = 1.0  # an actor's poll returns at least this often, even with nothing finished
SHUTDOWN_WAIT_S = 5.0  # graceful actor shutdown before ray.kill
MAX_CONCURRENCY = 4  # call threads per actor: poll + submit + abort/stats, beside the loop thread


class RaySession:
    """Ray for one Omni: used, connected to or started, and undone accordingly on close."""

    def __init__(self, runtime: RuntimeConfig) -> None:
        # Before ray.init: no ~/.ray/auth_token, no usage reporting (ENV-FACTS).
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        self.temp_dir: str | None = None
        self.mode = "existing"
        if ray.is_initialized():
            if runtime.address is not None:
                logger.warning(
                    "runtime.address=%r is not used: this process is already connected to Ray "
                    "(call ray.shutdown() first to connect elsewhere)",
                    runtime.address,
                )
            return
        quiet = {"logging_level": logging.WARNING, "configure_logging": True}
        if runtime.address is not None:
            ray.init(address=runtime.address, **quiet)
            self.mode = "connected"
            return
        # A short path: Ray's unix sockets live below it (108-byte limit).
        self.temp_dir = tempfile.mkdtemp(prefix="omni-ray-", dir="/tmp")
        try:
            ray.init(
                num_cpus=runtime.num_cpus or os.cpu_count(),
                include_dashboard=False,
                _temp_dir=self.temp_dir,
                **quiet,
            )
        except BaseException:
            shutil.rmtree(self.temp_dir, ignore_errors=True)
            raise
        self.mode = "started"

    def node_resources(self) -> list[dict[str, float]]:
        return [node["Resources"] for node in ray.nodes() if node.get("Alive")]

    def close(self) -> None:
        if self.mode in ("connected", "started") and ray.is_initialized():
            ray.shutdown()  # "started": also stops the raylet, GCS and workers it launched
        if self.temp_dir is not None:
            # Ray's processes exit asynchronously; they write logs below temp_dir until then.
            left = wait_for_processes_gone(self.temp_dir)
            if left:
                logger.warning("Ray processes %s still running after shutdown", left)
            shutil.rmtree(self.temp_dir, ignore_errors=True)
        self.mode = "closed"


def start_ray_stages(
    config: OmniConfig, order: list[str], processors: dict[str, Processor]
) -> RayBackend:
    return RayBackend(config, order, processors)


class RayBackend:
    def __init__(
        self, config: OmniConfig, order: list[str], processors: dict[str, Processor]
    ) -> None:
        self.config = config
        self.timeout_s = config.runtime.request_timeout_s
        self.session = RaySession(config.runtime)
        self.actors: dict[str, Any] = {}
        self._polls: dict[Any, str] = {}  # outstanding poll ref -> stage
        self._calls: dict[Any, str] = {}  # outstanding submit ref -> stage (errors surface)
        try:
            # Ray would leave an actor that fits nowhere pending forever: refuse up front.
            check_resources(config, self.session.node_resources())
            for name in order:
                self.actors[name] = self._create(name, processors)
            self.placement = self._wait_ready()
            for name in order:
                self._start_poll(name)
        except BaseException:
            self.shutdown()
            raise

    def _create(self, name: str, processors: dict[str, Processor]) -> Any:
        from omni.actor import StageActor

        stage = self.config.stage(name)
        mine = {p: processors[p] for p in [stage.input_processor] if p is not None}
        res = stage.resources
        return StageActor.options(
            num_cpus=res.num_cpus,
            num_gpus=res.num_gpus,
            resources=dict(res.custom) or None,
            max_concurrency=MAX_CONCURRENCY,
            max_restarts=0,  # a restarted stage would have lost its requests: fail loudly
        ).remote(
            stage,
            mine,
            log_level=self.config.runtime.log_level,
            fetch_timeout_s=self.timeout_s,
        )

    def _wait_ready(self) -> dict[str, dict]:
        refs = {self.actors[name].ready.remote(): name for name in self.actors}
        ready, pending = ray.wait(list(refs), num_returns=len(refs), timeout=self.timeout_s)
        if pending:
            late = sorted(refs[r] for r in pending)
            raise RuntimeError(
                f"stage actor(s) {late} not ready after {self.timeout_s:g} s "
                "(runtime.request_timeout_s): model loading too slow or resources unavailable"
            )
        placement = {}
        for ref in ready:
            name = refs[ref]
            try:
                placement[name] = ray.get(ref, timeout=self.timeout_s)
            except ray.exceptions.RayError as e:  # the actor's __init__ raised
                raise RuntimeError(f"stage {name!r} failed to start: {_cause(e)}") from e
        return placement

    def _start_poll(self, name: str) -> None:
        self._polls[self.actors[name].poll.remote(ACTOR_POLL_S)] = name

    def _get(self, ref: Any, stage: str, what: str = "call") -> Any:
        try:
            return ray.get(ref, timeout=self.timeout_s)
        except ray.exceptions.RayActorError as e:
            raise RuntimeError(
                f"stage {stage!r}: its Ray actor died ({type(e).__name__}); the pipeline cannot "
                f"continue, call Omni.shutdown(). Cause: {_cause(e)}"
            ) from e
        except ray.exceptions.RayError as e:
            raise RuntimeError(f"stage {stage!r}: {what} failed: {_cause(e)}") from e

    # ---- StageBackend -------------------------------------------------------------------------
    def submit(self, stage: str, items: list[StageInput | RoutedInput]) -> None:
        wire = [pack_input(item) for item in items]
        self._calls[self.actors[stage].submit.remote(wire)] = stage

    def poll(self, timeout_s: float) -> list[Finished]:
        refs = [*self._polls, *self._calls]
        ready, _ = ray.wait(refs, num_returns=1, timeout=timeout_s)
        if not ready:
            return []
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        out: list[Finished] = []
        for ref in ready:
            if ref in self._calls:
                self._get(ref, self._calls.pop(ref), "submit")
                continue
            stage = self._polls.pop(ref)
            batch = self._get(ref, stage, "poll")
            self._start_poll(stage)
            out.extend(Finished(result, payload) for result, payload in batch)
        return out

    def fetch(self, payloads: list[Any]) -> list[StageResult]:
        if not payloads:
            return []
        try:
            packed = ray.get(list(payloads), timeout=self.timeout_s)
        except ray.exceptions.RayError as e:
            raise RuntimeError(f"fetching stage results failed: {_cause(e)}") from e
        return [unpack_result(r) for r in packed]

    def abort(self, stage: str, request_ids: list[str]) -> None:
        if stage in self.actors:
            self.actors[stage].abort.remote(request_ids)  # fire and forget: best effort

    def stats(self) -> dict[str, dict]:
        refs = {name: actor.stats.remote() for name, actor in self.actors.items()}
        return {name: self._get(ref, name, "stats") for name, ref in refs.items()}

    def shutdown(self) -> None:
        actors, self.actors = self.actors, {}
        self._polls, self._calls = {}, {}
        if actors and ray.is_initialized():
            stops = [a.shutdown.remote() for a in actors.values()]
            ray.wait(stops, num_returns=len(stops), timeout=SHUTDOWN_WAIT_S)
            for actor in actors.values():
                ray.kill(actor, no_restart=True)
        self.session.close()


def _cause(e: BaseException) -> str:
    """The last line of a Ray error's text: the original exception ("OSError: no file ...")."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(e)).strip()  # Ray colours its messages
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else type(e).__name__


def wait_for_processes_gone(marker: str, timeout_s: float = 10.0) -> list[int]:
    """Pids whose command line contains `marker` still alive after timeout_s (none: [])."""
    deadline = time.monotonic() + timeout_s
    while True:
        alive = _pids_with(marker)
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.2)


def _pids_with(marker: str) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    pids.append(int(entry))
        except OSError:
            continue
    return pids
