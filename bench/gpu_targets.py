"""Issue 20's table in bench/gpu.py: each part's report returns its rows (what, omni,
transformers, target, verdict); a part prints its own right away (a run cut short keeps them) and
bench/gpu.py prints all of them once more at the end."""

from __future__ import annotations

import math

import numpy as np
from bench_table import table

Target = tuple[str, str, str, str, str]
HEADER = ("what", "omni", "transformers, same device", "target", "met")


def verdict(ok: bool | None) -> str:
    """PASS / FAIL; None: the target does not apply to this run (a smaller layout, another
    workload than the issue's)."""
    return "-" if ok is None else "PASS" if ok else "FAIL"


def print_targets(rows: list[Target], title: str) -> None:
    if not rows:
        return
    print(f"\n{title} (reported, never asserted; '-': not the issue's layout or workload)")
    table(HEADER, rows)


def pct(values: list[float], q: float) -> float:
    """The q-th percentile, linearly interpolated (with few values p99 is about the max; nan
    values are left out)."""
    clean = [v for v in values if not math.isnan(v)]
    return float(np.percentile(clean, q)) if clean else float("nan")
