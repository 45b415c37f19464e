"""The examples and the CLI's run command, end to end as a user runs them (subprocesses), on
the CPU on any machine: the subprocesses see no GPU (`CUDA_VISIBLE_DEVICES` empty)."""

import os
import re
import subprocess
import sys
import wave
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


def run(*args: str, timeout: int = 300) -> str:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(
        [sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout, env=env
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_long_document_second_question_uses_the_cache(qwen2_dir):
    out = run("examples/long_document.py", "--model", qwen2_dir)
    served = [int(n) for n in re.findall(r"(\d+) served from the prefix cache", out)]
    prompt = [int(n) for n in re.findall(r"(\d+) prompt tokens", out)]
    assert len(served) == 2 and served[0] == 0
    assert served[1] > 0.9 * prompt[1]


def test_omni_speech_writes_a_wav(tmp_path):
    out = run("examples/omni_speech.py", "--out", str(tmp_path / "a.wav"))
    assert "codec tokens:" in out
    with wave.open(str(tmp_path / "a.wav")) as f:
        assert f.getframerate() == 24000 and f.getnchannels() == 1 and f.getnframes() > 0
        samples = np.frombuffer(f.readframes(f.getnframes()), "<i2")
    assert np.abs(samples).max() > 0  # not silence


def test_cli_run_with_image_and_wav(tmp_path):
    from tools.make_tiny_checkpoint import ensure_checkpoint

    model = ensure_checkpoint("qwen2_5_omni", "tiny")
    image = tmp_path / "card.png"
    Image.fromarray(np.full((56, 84, 3), 200, dtype=np.uint8)).save(image)
    wav = tmp_path / "answer.wav"
    out = run(
        "-m", "omni.entrypoints.cli", "run", "stage_configs/qwen2_5_omni.yaml", "--model", str(model),
        "--prompt", "What is in the picture?", "--image", str(image), "--max-tokens", "6",
        "--set", "runtime.backend=local", "--output-wav", str(wav),
    )  # fmt: skip
    summary = out.rstrip("\n").split("\n")[-1]
    assert summary.startswith("[omni] 6 tokens; first token ") and f"wrote {wav}" in summary
    assert "cached prompt tokens: thinker 0, talker 0" in summary and "audio " in summary
    with wave.open(str(wav)) as f:
        assert f.getnframes() > 0
