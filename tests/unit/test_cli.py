"""The `omni` command line: validate (torch-free, exit 2 with the message on a bad config) and
run's argument handling (no models loaded here: the run path itself is covered by the demo)."""

from __future__ import annotations

import json
import subprocess
import sys
import wave
from pathlib import Path

import numpy as np
import pytest

from omni.audio import write_wav
from omni.entrypoints.cli import main

REPO = Path(__file__).resolve().parents[2]
TWO_STAGE = str(REPO / "stage_configs" / "tiny_two_stage.yaml")
ONE_STAGE = str(REPO / "stage_configs" / "tiny_causal_lm.yaml")


@pytest.fixture
def model(tmp_path: Path) -> str:
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps({"model_type": "llama"}))
    return str(tmp_path / "ckpt")


def test_validate_prints_stages_and_edges(model, capsys):
    assert (
        main(["validate", TWO_STAGE, "--var", f"MODEL_A={model}", "--var", f"MODEL_B={model}"]) == 0
    )
    out = capsys.readouterr().out
    assert "stage a: ar causal_lm" in out and "stage b: ar embeds_lm" in out
    assert "a -> b (hidden_to_embeds)" in out
    assert "final stage: b" in out


def test_validate_model_and_set(model, capsys):
    argv = ["validate", ONE_STAGE, "--model", model, "--set", "stages.llm.engine.num_blocks=64"]
    assert main(argv) == 0
    assert "64 blocks x 16 tokens" in capsys.readouterr().out


def test_validate_prints_the_device_plan(tmp_path, capsys, monkeypatch):
    omni_dir = tmp_path / "omni"
    omni_dir.mkdir()
    (omni_dir / "config.json").write_text(json.dumps({"model_type": "qwen2_5_omni"}))
    argv = ["validate", str(REPO / "stage_configs" / "qwen2_5_omni.yaml")]
    argv += ["--model", str(omni_dir)]
    assert main([*argv, "--num-gpus", "1"]) == 0
    out = capsys.readouterr().out
    assert "device plan with 1 GPU(s):" in out
    assert "  thinker: cuda, 0.65 GPU (planned), memory share 0.585, bfloat16" in out
    assert "  talker: cuda, 0.25 GPU (planned), memory share 0.225, bfloat16" in out
    assert "  token2wav: cuda, 0.1 GPU (planned), memory share 0.09, float32" in out
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # the default: the GPUs this process sees
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "device plan with 0 GPU(s):\n  thinker: cpu, float32\n  talker: cpu, float32" in out
    too_much = ["--set", "stages.thinker.resources.gpu_share=0.8", "--num-gpus", "1"]
    assert main([*argv, *too_much]) == 2
    err = capsys.readouterr().err
    assert "stages.thinker.resources.gpu_share=0.8, stages.talker.resources.gpu_share" in err


@pytest.mark.parametrize(
    ("extra", "fragments"),
    [
        (["--set", "stages.llm.engine.num_blokcs=64"], ["num_blokcs", "num_blocks"]),
        (["--set", "stages.llm.engine.block_size=0"], ["stage 'llm'", "block_size", ">= 1"]),
        (["--set", "runtime.backend=mpi"], ["runtime.backend", "'mpi'"]),
        (["--set", "nonsense"], ["KEY=VALUE", "nonsense"]),
    ],
)
def test_validate_bad_config_exits_2(model, capsys, extra, fragments):
    assert main(["validate", ONE_STAGE, "--model", model, *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("omni: config error:")
    for fragment in fragments:
        assert fragment in err, err


def test_missing_variable_and_file_exit_2(capsys, tmp_path):
    assert main(["validate", ONE_STAGE]) == 2
    assert "${MODEL}" in capsys.readouterr().err
    assert main(["validate", str(tmp_path / "nope.yaml")]) == 2
    assert "nope.yaml" in capsys.readouterr().err


def test_run_rejects_bad_config_before_loading_models(model, capsys):
    argv = ["run", ONE_STAGE, "--model", model, "--prompt", "hi", "--set", "runtime.bogus=1"]
    assert main(argv) == 2
    assert "bogus" in capsys.readouterr().err


def test_console_script_is_torch_free(model):
    code = (
        "import sys; from omni.entrypoints.cli import main; "
        f"rc = main(['validate', {ONE_STAGE!r}, '--model', {model!r}]); "
        "assert 'torch' not in sys.modules, 'torch imported'; sys.exit(rc)"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "stage llm" in done.stdout


def test_write_wav(tmp_path):
    path = str(tmp_path / "out.wav")
    write_wav(path, np.array([0.0, 0.5, -2.0, 1.0], dtype=np.float32), 16000)
    with wave.open(path) as f:
        assert (f.getnchannels(), f.getsampwidth(), f.getframerate()) == (1, 2, 16000)
        frames = np.frombuffer(f.readframes(4), dtype="<i2")
    assert frames.tolist() == [0, 16383, -32767, 32767]
