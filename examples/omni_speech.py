"""Image + question in, text and a WAV file out, through the 3-stage Qwen2.5-Omni pipeline.

    python examples/omni_speech.py [--model DIR] [--out answer.wav]

Without --model it builds (once) the tiny random-weight checkpoint, so the text and the audio
are noise, but every stage runs: thinker -> talker -> token2wav.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from omni import Omni, SamplingParams  # noqa: E402
from omni.audio import write_wav  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="Qwen2.5-Omni checkpoint directory")
    parser.add_argument("--out", default="answer.wav")
    parser.add_argument("--backend", default="local", choices=["local", "ray"])
    args = parser.parse_args()
    if args.model is None:
        from tools.make_tiny_checkpoint import ensure_checkpoint

        args.model = str(ensure_checkpoint("qwen2_5_omni", "tiny"))
    # A small gradient test image: no downloads needed.
    pixels = np.zeros((56, 84, 3), dtype=np.uint8)
    pixels[..., 0] = np.linspace(0, 255, 84, dtype=np.uint8)
    pixels[..., 2] = np.linspace(255, 0, 56, dtype=np.uint8)[:, None]
    prompt = {
        "prompt": "<|vision_bos|><|IMAGE|><|vision_eos|>What colours are in this picture?",
        "images": [Image.fromarray(pixels)],
    }
    params = [
        SamplingParams(max_tokens=16),  # thinker
        SamplingParams(max_tokens=64, stop_token_ids=(8292, 8294)),  # talker
        SamplingParams(max_tokens=1, seed=0),  # token2wav: the DiT noise seed
    ]
    with Omni(model=args.model, runtime={"backend": args.backend}) as omni:
        out = omni.generate([prompt], params, use_tqdm=False)[0]
    if out.error:
        raise SystemExit(f"request failed: {out.error}")
    print("text:", out.stages["thinker"].text)
    print("codec tokens:", len(out.stages["talker"].token_ids))
    seconds = write_wav(args.out, out.final.audio, out.final.sample_rate)
    print(f"wrote {args.out}: {seconds:.2f} s at {out.final.sample_rate} Hz")


if __name__ == "__main__":
    main()
