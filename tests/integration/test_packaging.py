"""The stage configs live in the project's top-level stage_configs/ (beside omni/, stages/ and
kernels/), the wheel ships them there too (the data package `stage_configs`, installed beside
`omni`), and both a checkout and an installed copy find them from any working directory:
`omni validate --model DIR` and `Omni(model=DIR)` pick stage_configs/<model_type>.yaml.

The wheel is built offline (--no-build-isolation: the venv's setuptools) from a copy of the
source tree, so the build leaves no build/ or egg-info behind in the repository, and installed
with `pip install --target` into a folder put ahead of the venv's editable install.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from helpers import OMNI_ON_CPU, python_path

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
SHIPPED = ("qwen2_5_omni.yaml", "tiny_two_stage.yaml", "tiny_causal_lm.yaml")
PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]


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
        [*PIP, "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp / "dist"), str(src)],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    (found,) = (tmp / "dist").glob("omni-*.whl")
    return found


@pytest.fixture(scope="module")
def site(wheel, tmp_path_factory) -> Path:
    """The wheel installed (without dependencies: the venv has them) into a folder of its own."""
    target = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [*PIP, "install", "--no-deps", "--no-index", "--target", str(target), str(wheel)],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return target


@pytest.fixture
def omni_type_dir(tmp_path) -> str:
    """A checkpoint directory that only says model_type qwen2_5_omni (enough for `validate`)."""
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps({"model_type": "qwen2_5_omni"}))
    return str(tmp_path / "ckpt")


def _python(code_or_args: list[str], path: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    # Ahead of the venv's editable install; the checkout itself is left out when `path` is not it.
    env = {**os.environ, "PYTHONPATH": python_path(path, leave_out=REPO)}
    return subprocess.run(
        [sys.executable, *code_or_args], cwd=cwd, env=env, capture_output=True, text=True
    )


def test_wheel_contains_the_stage_configs_at_the_top_level(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {f"stage_configs/{name}" for name in SHIPPED} <= names
    # Every config of the source tree, not only the ones named above; none left inside omni/.
    assert {f"stage_configs/{p.name}" for p in (REPO / "stage_configs").glob("*.yaml")} <= names
    assert not any(n.startswith("omni/stage_configs/") for n in names)
    assert not (REPO / "omni" / "stage_configs").exists()
    assert "omni/config/schema.py" in names and "stages/causal_lm.py" in names


@pytest.mark.parametrize("where", ["checkout", "wheel", "editable"])
def test_validate_finds_the_shipped_config_from_another_directory(
    where, request, tmp_path, omni_type_dir
):
    """editable: nothing on PYTHONPATH; the venv's `pip install -e .` (the Makefile's) is found
    through the finder it adds to sys.meta_path, not sys.path: the manifests too."""
    path = request.getfixturevalue("site") if where == "wheel" else REPO
    if where == "editable":
        if not _installed_editable():
            pytest.skip("omni is not installed editable in this Python (`make` installs it)")
        path = tmp_path / "nothing"  # an empty PYTHONPATH entry in place of the checkout
        path.mkdir()
    code = (
        "import json, omni.config as c; "
        "print(json.dumps([c.__file__, c.STAGE_CONFIG_DIR, sorted(__import__('os').listdir("
        "c.STAGE_CONFIG_DIR))]))"
    )
    done = _python(["-c", code], path, tmp_path)
    assert done.returncode == 0, done.stderr
    module, config_dir, files = json.loads(done.stdout)
    root = REPO if where == "editable" else path
    assert Path(module).is_relative_to(root)
    assert Path(config_dir) == root / "stage_configs"
    assert set(SHIPPED) <= set(files)
    # Without a CONFIG argument, --model picks stage_configs/qwen2_5_omni.yaml: three stages
    # (the one-stage causal-LM fallback would refuse this model_type instead).
    args = ["-m", "omni.entrypoints.cli", "validate", "--model", omni_type_dir, "--num-gpus", "0"]
    done = _python(args, path, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 stage(s)" in done.stdout
    assert "thinker -> talker (thinker_to_talker)" in done.stdout
    assert "talker -> token2wav (talker_to_token2wav)" in done.stdout


def _installed_editable() -> bool:
    """Whether some installed omni is this checkout, editable (the checkout's own egg-info on
    sys.path, which says nothing of an install, is passed over)."""
    for dist in importlib.metadata.distributions(name="omni"):
        url = json.loads(dist.read_text("direct_url.json") or "{}")
        if url.get("dir_info", {}).get("editable") and url.get("url") == REPO.as_uri():
            return True
    return False


def test_installed_omni_runs_a_checkpoint_by_its_model_type(site, omni_dir, tmp_path):
    """Omni(model=DIR) from the installed copy: the shipped three-stage pipeline, run."""
    overrides = {"runtime": {"backend": "local"}, **OMNI_ON_CPU}
    code = f"""
import json, omni
from omni import Omni, SamplingParams
with Omni(model={omni_dir!r}, **{overrides!r}) as o:
    (out,) = o.generate(["hello"], SamplingParams(max_tokens=4), use_tqdm=False)
print(json.dumps([omni.__file__, o.config.stage_names, out.error, list(out.stages),
                  int(out.final.audio.numel())]))
"""
    done = _python(["-c", code], site, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    module, stage_names, error, finished, num_samples = json.loads(done.stdout.splitlines()[-1])
    assert Path(module).is_relative_to(site)
    assert stage_names == finished == ["thinker", "talker", "token2wav"]
    assert error is None and num_samples > 0
