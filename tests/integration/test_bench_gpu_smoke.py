"""bench/gpu.py end to end on the CPU with the tiny layouts (its documented smoke run): every
part runs without a traceback, and the closing table has every row of issue 20's table, so a
bench broken on the CPU is found here, not in a GPU session's few device minutes. The figures
themselves are CPU noise: only the rows' presence and the run's success are asserted."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import python_path

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
ARGS = (
    "--device cpu --size tiny --requests 2 --single 1 --hf-requests 1 --prefix-tokens 256 "
    "--prefix-requests 2 --decode-batch 2,4 --decode-tokens 8 --profile --profile-batch 4,2"
).split()
ROWS = [
    "first audio, one request (p50)",
    "same, req/s one at a time",
    "same, one request: thinker per token / talker per code",
    "same, 2 at once",
    "TTFT cached vs uncached",
    "decode step, B=2",
    "decode step, B=4",
    "GPU busy share of a decode step, B=4",
]


def test_the_gpu_bench_runs_every_part_on_the_cpu():
    env = {**os.environ, "PYTHONPATH": python_path(REPO), "OMP_NUM_THREADS": "1"}
    run = subprocess.run(
        [sys.executable, str(REPO / "bench" / "gpu.py"), *ARGS],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-4000:]
    assert "Traceback" not in output, output[-4000:]
    startup = output.index("start-up s")  # the decode part's start-up table, capture included
    assert "graphs captured" in output[startup : startup + 200]
    profile = output[output.index("profile (torch.profiler, B=4, B=2)") :]
    for batch in (2, 4):  # a window per --profile-batch, in each graph mode
        assert f"|        graphs on | {batch} |" in profile, profile[:3000]
    table = output[output.index("## Issue 20's table") :]
    for row in ROWS:
        assert row in table, f"{row!r} missing from the closing table:\n{table}"
    # The decode rows name the stage-process pass with a time (its steps timed in that process).
    assert table.count("stage process ") == 2 and "stage process n/a" not in table, table
