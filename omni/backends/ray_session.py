"""Ray for one pipeline: an already initialized Ray is used as it is and left running;
`runtime.address` is connected to and disconnected from on close; otherwise a private local Ray
instance is started (ENV-FACTS settings: no dashboard, no auth token, no usage stats, a temp dir of
its own under /tmp) and shut down, with all its processes, by `close`.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
import time

import ray

from omni.config import RuntimeConfig

logger = logging.getLogger(__name__)


class RaySession:
    """Ray for one Omni: used, connected to or started, and undone accordingly on close."""

    def __init__(self, runtime: RuntimeConfig) -> None:
        # Before ray.init: no ~/.ray/auth_token, no usage reporting (ENV-FACTS).
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        # Every call to a stage actor is a Ray task whose events the GCS keeps (100,000 by
        # default): a serving process's GCS grew 55 -> 213 MiB over 3,000 requests in the soak
        # (docs/soak.md). A cluster this session starts keeps the last 2,000.
        os.environ.setdefault("RAY_task_events_max_num_task_in_gcs", "2000")
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
        """Each live node's total resources."""
        return [node["Resources"] for node in ray.nodes() if node.get("Alive")]

    def available_resources(self) -> dict[str, float]:
        """What no actor or task holds now, summed over the cluster."""
        return dict(ray.available_resources())

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


def ray_error_cause(e: BaseException) -> str:
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
