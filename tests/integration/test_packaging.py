"""The built wheel ships the stage configs inside the package, and an installed omni finds them
from any working directory (STAGE_CONFIG_DIR points into the package, not into a checkout).

The wheel is built offline (--no-build-isolation: the venv's setuptools) from a copy of the
source tree, so the build leaves no build/ or egg-info behind in the repository.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
SHIPPED = ("qwen2_5_omni.yaml", "tiny_two_stage.yaml", "tiny_causal_lm.yaml")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    skip = shutil.ignore_patterns(
        ".git", ".venv", ".cache", ".*_cache", ".hypothesis", "__pycache__", "*.egg-info",
        "build", "dist", "out", "tmp",
    )  # fmt: skip
    shutil.copytree(REPO, src, ignore=skip)
    done = subprocess.run(
        [
            sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
            "--disable-pip-version-check", "-q", "-w", str(tmp / "dist"), str(src),
        ],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    (found,) = (tmp / "dist").glob("omni-*.whl")
    return found


def test_wheel_contains_the_stage_configs(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for name in SHIPPED:
        assert f"omni/stage_configs/{name}" in names
    # Every config of the source tree, not only the ones named above.
    for path in (REPO / "omni" / "stage_configs").glob("*.yaml"):
        assert f"omni/stage_configs/{path.name}" in names
    assert "omni/config/schema.py" in names


def test_unpacked_wheel_finds_its_configs_from_another_directory(wheel, tmp_path):
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    code = (
        "import json, os, omni.config as c; "
        "print(json.dumps([c.__file__, c.STAGE_CONFIG_DIR, sorted(os.listdir(c.STAGE_CONFIG_DIR))]))"
    )
    env = {**os.environ, "PYTHONPATH": str(site)}  # ahead of the venv's editable install
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=elsewhere, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    module, config_dir, files = json.loads(done.stdout)
    assert Path(module).is_relative_to(site)
    assert Path(config_dir) == site / "omni" / "stage_configs"
    assert set(SHIPPED) <= set(files)
