"""bench/dit_kernels.py on the tiny DiT layout: it runs, finds omni's evaluation equal to
transformers' layers bit for bit, and counts fewer kernels for it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import python_path

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


def test_the_dit_kernel_bench_counts_fewer_kernels_for_the_same_velocity():
    env = {**os.environ, "PYTHONPATH": python_path(REPO), "OMP_NUM_THREADS": "1"}
    run = subprocess.run(
        [sys.executable, str(REPO / "bench" / "dit_kernels.py"), "--layout", "tiny"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "the same velocity bit for bit: True" in run.stdout
    counts = re.search(r"36 evaluations: ([\d,]+) -> ([\d,]+) kernels", run.stdout)
    assert counts, run.stdout
    theirs, ours = (int(n.replace(",", "")) for n in counts.groups())
    assert 0 < ours < theirs
