"""`pytest -m cuda` on a machine with neither the server extras nor Ray (the lent GPU machines):
collection succeeds and finds every `cuda` test, because the modules -m deselects entirely are
never imported (tests/conftest.py) and `import omni` needs no server extra."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import python_path

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
# httpx is not hidden: the GPU machines have it, and their huggingface_hub imports it.
HIDDEN = ("fastapi", "openai", "prometheus_client", "pydantic", "ray", "starlette")
BLOCKER = f"""
import sys
class _Hidden:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {HIDDEN!r}:
            raise ImportError(f"{{name}} is hidden (not installed on the GPU machine)")
sys.meta_path.insert(0, _Hidden())
"""


def _num_cuda_tests() -> int:
    """Tests under tests/cuda marked cuda (module-wide): counted from the source."""
    count = 0
    for path in (REPO / "tests" / "cuda").glob("test_*.py"):
        source = path.read_text()
        if "pytest.mark.cuda" in source:
            count += sum(
                1
                for node in ast.walk(ast.parse(source))
                if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")
            )
    return count


def test_cuda_selection_collects_without_the_server_extras_and_ray(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(BLOCKER)
    env = {**os.environ, "PYTHONPATH": python_path(tmp_path, REPO), "CUDA_VISIBLE_DEVICES": ""}
    hidden = subprocess.run(
        [sys.executable, "-c", "import pydantic"], env=env, capture_output=True, text=True
    )
    assert hidden.returncode != 0 and "hidden" in hidden.stderr  # the blocker works
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-m",
            "cuda",
            "-p",
            "no:cacheprovider",
            "tests",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    summary = run.stdout.strip().splitlines()[-1]
    assert "collected" in summary and "error" not in summary, run.stdout[-3000:]
    collected = [line for line in run.stdout.splitlines() if "::" in line]
    assert collected and all(line.startswith("tests/") for line in collected)
    assert len(collected) >= _num_cuda_tests() > 0, run.stdout[-2000:]
