"""Ray on a GPU machine: stages land where the plan says (docs/gpu.md, "First run on a GPU
machine", step 5; issue 21 items 2 and 3). Runs the tiny Qwen2.5-Omni pipeline on a local Ray
cluster twice and checks each stage's device, dtype and Ray GPU ids:

1. thinker 0.5 and talker 0.3 of the GPU (given), token2wav planned (its `gpu_share` 0.1):
   all three on cuda:0 with the one GPU's id; thinker and talker bfloat16, token2wav float32.
2. the same with token2wav `num_gpus: 0`: it reserves none, so it sees none and runs on the CPU
   (float32, no GPU ids), even though the node has a GPU.

Each run must give audio and no error. Prints one line per stage and `ray gpu check: ok`, or
the mismatches and exit status 1. Needs Ray and a GPU: `python3 tools/ray_gpu_check.py`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from omni import Omni  # noqa: E402
from tools.make_tiny_checkpoint import ensure_checkpoint  # noqa: E402

SPLIT = {"stages.thinker.resources.num_gpus": 0.5, "stages.talker.resources.num_gpus": 0.3}
EXPECTED_SPLIT = {
    "thinker": ("cuda:0", "bfloat16", True),
    "talker": ("cuda:0", "bfloat16", True),
    "token2wav": ("cuda:0", "float32", True),
}
NO_GPU = {**SPLIT, "stages.token2wav.resources.num_gpus": 0}
EXPECTED_NO_GPU = {**EXPECTED_SPLIT, "token2wav": ("cpu", "float32", False)}


def run(model: str, overrides: dict[str, Any], expected: dict[str, tuple]) -> list[str]:
    problems = []
    with Omni(model=model, runtime={"backend": "ray"}, **overrides) as omni:
        (out,) = omni.generate(["hello there"], use_tqdm=False)
        samples = out.final.audio.numel() if out.final.audio is not None else 0
        print(f"  error {out.error}, audio samples {samples}")
        if out.error or not samples:
            problems.append(f"no audio: error {out.error}, {samples} samples")
        for name, stats in omni.stats().items():
            got = (stats.get("device"), stats.get("dtype"), bool(stats.get("gpu_ids")))
            print(f"  {name}: {got[0]} {got[1]} gpu_ids {stats.get('gpu_ids')}")
            if name in expected and got != expected[name]:
                problems.append(f"{name}: got {got}, expected {expected[name]}")
    return problems


def main() -> None:
    model = str(ensure_checkpoint("qwen2_5_omni", "tiny"))
    problems = []
    for title, overrides, expected in (
        ("split 0.5 / 0.3 / planned", SPLIT, EXPECTED_SPLIT),
        ("token2wav num_gpus 0", NO_GPU, EXPECTED_NO_GPU),
    ):
        print(f"{title}: {overrides}")
        problems += [f"{title}: {p}" for p in run(model, overrides, expected)]
    for problem in problems:
        print("!!", problem)
    print("ray gpu check:", "ok" if not problems else f"{len(problems)} problem(s)")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
