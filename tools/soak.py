"""The soak: N requests of mixed kinds (tools/soak_requests.py) through a running `omni serve`
from C concurrent clients, and the checks that nothing was lost or leaked. bench/soak.py prints
it as tables; tests/integration/test_soak.py runs a short one.

1. Plan: N jobs (kind, prompt of a fixed set, variant) drawn from a seed.
2. References: each (reference kind, prompt) sent once, one at a time, before the load.
3. Load: C workers take the jobs in order; each answer is compared with its prompt's reference
   as it arrives (greedy sampling: the same prompt must give the same answer under any load).
   The server's RSS is read at every `rss_every` completed requests.
4. End: the server must report, on /metrics, no request running or waiting and no KV block in
   use in any stage; aborted requests are given `settle_s` to get there.

`SoakReport.failures()` lists every broken rule: an error (a request lost, or a bad request not
answered with its 4xx), a divergence, blocks or requests left, RSS growth of 5% or more over the
second half of the run.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np
import openai
from prometheus_client.parser import text_string_to_metric_families

from tools.soak_requests import KINDS, MODEL, REFERENCE_KIND, Answer, Job, Outcome, Sender, diverges

MAX_RSS_GROWTH = 0.05


def server_args(
    model_dir: str, backend: str = "local", talker_tokens: int = 16, max_tokens: int = 8
) -> list[str]:
    """`omni serve` arguments for the soak: the model as MODEL, greedy as shipped, the talker
    capped at talker_tokens codes (the cost of every audio request), max_tokens the default of
    a request that sets none (a transcription)."""
    return [
        "--model", model_dir, "--served-model-name", MODEL, "--max-tokens", str(max_tokens),
        "--set", f"runtime.backend={backend}",
        "--set", f"stages.talker.sampling.max_tokens={talker_tokens}",
    ]  # fmt: skip


SERVER_ENV = {"RAY_task_events_max_num_task_in_gcs": "2000"}
"""The soak's server environment. Ray's GCS keeps the events of the last 100,000 tasks (its
default); every actor call of the ray backend is a task, so under the soak the gcs_server grows
by about 50 MiB per 1,000 requests until that store is full, which would hide a leak in the stage
actors from the RSS check. 2,000 keeps it at about 55 MiB (docs/soak.md); the local backend
starts no Ray and ignores it."""


@dataclasses.dataclass(frozen=True)
class SoakConfig:
    num_requests: int = 10_000
    """Requests in the load (the references come on top)."""
    concurrency: int = 32
    """Clients sending at once, each its next request as soon as its last one ended."""
    num_prompts: int = 20
    """Distinct prompts; every one gets a reference per kind."""
    max_tokens: int = 8
    """Thinker tokens of each chat and completion."""
    seed: int = 0
    """Seeds the plan (kinds, prompts, variants)."""
    rss_every: int = 0
    """Read the server's RSS every this many requests; 0: a tenth of num_requests."""
    settle_s: float = 60.0
    """Longest wait at the end for the server to have no request running and no block in use."""

    def __post_init__(self) -> None:
        for name in ("num_requests", "concurrency", "num_prompts", "max_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"SoakConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.rss_every < 0:
            raise ValueError(f"SoakConfig.rss_every must be >= 0, got {self.rss_every}")

    @property
    def rss_interval(self) -> int:
        return self.rss_every or max(1, self.num_requests // 10)


@dataclasses.dataclass
class KindStats:
    count: int = 0
    errors: int = 0
    diverged: int = 0
    left_early: int = 0
    """Requests the client left before their end (disconnect)."""
    latencies_s: list[float] = dataclasses.field(default_factory=list)
    ttfas_s: list[float] = dataclasses.field(default_factory=list)
    examples: list[str] = dataclasses.field(default_factory=list)
    """The first few errors and divergences, for the report."""


@dataclasses.dataclass(frozen=True)
class ServerState:
    running: float
    """omni_requests_running: requests in the engine."""
    waiting: float
    """omni_requests_waiting: requests accepted that have no output yet."""
    stages: dict[str, dict[str, float]]
    """Stage -> {"num_requests", "kv_blocks_in_use"}."""

    @property
    def idle(self) -> bool:
        stages = (v for s in self.stages.values() for v in s.values())
        return self.running == 0 and self.waiting == 0 and not any(stages)


@dataclasses.dataclass
class RssSample:
    num_done: int
    server_bytes: int
    """The `omni serve` process."""
    tree_bytes: int
    """It and all its descendants (Ray's processes and stage actors on the ray backend)."""


@dataclasses.dataclass
class SoakReport:
    config: SoakConfig
    kinds: dict[str, KindStats]
    rss: list[RssSample]
    num_references: int = 0
    wall_s: float = 0.0
    end: ServerState | None = None

    def rss_growth(self) -> tuple[float, float] | None:
        """(server, tree) relative RSS growth over the second half of the load."""
        half = self.config.num_requests - self.config.num_requests // 2
        start = next((s for s in self.rss if s.num_done >= half), None)
        last = self.rss[-1] if self.rss else None
        if start is None or last is None or last is start:
            return None
        return (
            last.server_bytes / start.server_bytes - 1,
            last.tree_bytes / start.tree_bytes - 1,
        )

    def failures(self) -> list[str]:
        out = []
        for kind, stats in self.kinds.items():
            if stats.errors or stats.diverged:
                out.append(
                    f"{kind}: {stats.errors} errors, {stats.diverged} diverged, e.g. "
                    + " | ".join(stats.examples)
                )
        done = sum(s.count for s in self.kinds.values())
        if done != self.config.num_requests:
            out.append(f"{done} of {self.config.num_requests} requests completed")
        if self.end is None or not self.end.idle:
            out.append(f"the server is not idle at the end: {self.end}")
        growth = self.rss_growth()
        if growth is not None and max(growth) >= MAX_RSS_GROWTH:
            out.append(
                f"RSS grew {growth[0]:.1%} (server), {growth[1]:.1%} (with its descendants) "
                f"over the second half; the limit is {MAX_RSS_GROWTH:.0%}"
            )
        return out


def plan(config: SoakConfig) -> list[Job]:
    rng = random.Random(config.seed)
    kinds = rng.choices(list(KINDS), weights=list(KINDS.values()), k=config.num_requests)
    return [
        Job(i, kind, rng.randrange(config.num_prompts), rng.randrange(1 << 16))
        for i, kind in enumerate(kinds)
    ]


def percentile_ms(values: list[float], q: float) -> str:
    return f"{np.percentile(values, q) * 1000:.0f}" if values else "-"


async def server_state(http: httpx.AsyncClient, base_url: str) -> ServerState:
    """The engine's counts from the server's /metrics (refreshed from engine.stats() there)."""
    text = (await http.get(base_url + "/metrics")).raise_for_status().text
    running = waiting = 0.0
    stages: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "omni_requests_running":
                running = s.value
            elif s.name == "omni_requests_waiting":
                waiting = s.value
            elif s.name in ("omni_stage_num_requests", "omni_stage_kv_blocks_in_use"):
                key = s.name.removeprefix("omni_stage_")
                stages.setdefault(s.labels["stage"], {})[key] = s.value
    return ServerState(running, waiting, stages)


def rss_bytes(pid: int) -> tuple[int, int]:
    """(RSS of pid, RSS of pid and all its descendants), from /proc (Linux)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue  # exited meanwhile
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    tree, frontier = {pid}, [pid]
    while frontier:
        parent = frontier.pop()
        children = [p for p, pp in parents.items() if pp == parent and p not in tree]
        tree.update(children)
        frontier.extend(children)
    sizes = {p: _vm_rss(p) for p in tree}
    return sizes[pid], sum(sizes.values())


def _vm_rss(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


async def references(sender: Sender, config: SoakConfig) -> dict[tuple[str, int], Answer]:
    """Each (reference kind, prompt) once, in order; the first failure raises."""
    out = {}
    for kind in sorted(set(REFERENCE_KIND.values())):
        for prompt in range(config.num_prompts):
            outcome = await sender.send(Job(-1, kind, prompt, 0))
            if not outcome.ok or outcome.answer is None:
                raise RuntimeError(f"reference {kind} #{prompt} failed: {outcome.error}")
            out[(kind, prompt)] = outcome.answer
    return out


async def run_soak(
    base_url: str,
    server_pid: int,
    config: SoakConfig,
    *,
    api_key: str = "-",
    progress: Callable[[SoakReport], None] | None = None,
) -> SoakReport:
    """The whole soak against the server at base_url (process server_pid, for its RSS);
    `progress` is called at every RSS sample."""
    report = SoakReport(config, {kind: KindStats() for kind in KINDS}, [])
    client = openai.AsyncOpenAI(base_url=base_url + "/v1", api_key=api_key, max_retries=0)
    sender = Sender(client, config.max_tokens)
    start = time.perf_counter()
    async with client, httpx.AsyncClient(timeout=30) as http:
        refs = await references(sender, config)
        report.num_references = len(refs)
        jobs = iter(plan(config))
        num_done = 0

        def record(outcome: Outcome) -> None:
            nonlocal num_done
            stats = report.kinds[outcome.job.kind]
            stats.count += 1
            problem = outcome.error
            if outcome.ok:
                stats.latencies_s.append(outcome.latency_s)
                stats.left_early += outcome.left_early
                if outcome.ttfa_s is not None:
                    stats.ttfas_s.append(outcome.ttfa_s)
                ref_kind = REFERENCE_KIND.get(outcome.job.kind)
                if ref_kind is not None and outcome.answer is not None:
                    problem = diverges(outcome.answer, refs[(ref_kind, outcome.job.prompt)])
                    stats.diverged += problem is not None
            else:
                stats.errors += 1
            if problem is not None and len(stats.examples) < 3:
                stats.examples.append(
                    f"#{outcome.job.index} prompt {outcome.job.prompt}: {problem}"
                )
            num_done += 1
            if num_done % config.rss_interval == 0 or num_done == config.num_requests:
                report.rss.append(RssSample(num_done, *rss_bytes(server_pid)))
                report.wall_s = time.perf_counter() - start
                if progress is not None:
                    progress(report)

        async def worker() -> None:
            for job in jobs:  # one iterator shared by all workers (one event loop thread)
                record(await sender.send(job))

        await asyncio.gather(*(worker() for _ in range(config.concurrency)))
        deadline = time.monotonic() + config.settle_s
        while True:
            report.end = await server_state(http, base_url)
            if report.end.idle or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
    report.wall_s = time.perf_counter() - start
    return report
