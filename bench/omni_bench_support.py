"""Shared parts of bench/omni_pipeline.py: its prompt material, the transformers side of the
comparison (one full `generate` per request, observed from the inside) and table printing."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from tools.omni_preprocess import OmniPreprocessor

CODEC_EOS = (8292, 8294)  # codec pad / codec end: where transformers' talker generate stops
SEED = 0  # DiT noise seed, the same on both sides

SUBJECTS = [
    "the weather",
    "a lighthouse",
    "the ocean tides",
    "a city at night",
    "mountain trails",
    "a quiet library",
    "old trains",
    "a busy market",
    "the northern lights",
    "desert dunes",
    "a coral reef",
    "autumn leaves",
    "a jazz club",
    "a snowy village",
    "a river delta",
    "a space station",
    "an orchard",
    "a violin workshop",
    "a tea garden",
    "a harbour crane",
]
QUESTIONS = [
    "Who wrote the section on block hashing?",
    "How many blocks does the pool keep free?",
    "Which stage reads the hidden states?",
    "What happens when a hash collides?",
    "Why is the last token always recomputed?",
    "Where does the output cache live?",
    "What evicts blocks first?",
    "Which ids stop the talker?",
]
SYSTEM = (
    "You are Qwen, a virtual human developed by the Qwen Team, Alibaba Group, capable of "
    "perceiving auditory and visual inputs, as well as generating text and speech."
)
SENTENCES = [
    "Prefix caching keeps the key and value blocks of every prompt a stage has seen.",
    "Each block is indexed by a hash of its tokens chained with the hash of the block before it.",
    "A new request looks up its longest cached prefix and computes only the rest.",
    "In a multi-stage pipeline each stage also keeps its per-token outputs beside the blocks.",
    "A cached prefix returns the hidden states the next stage needs without running the model.",
    "The block pool evicts the least recently used blocks, tails of sequences first.",
    "Hits are checked against the stored tokens, so a hash collision can only cause a miss.",
    "The talker turns the thinker's hidden states into codec tokens for the vocoder.",
]


def load_hf(model_dir: str):
    from transformers import Qwen2_5OmniForConditionalGeneration

    model = Qwen2_5OmniForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32)
    model.thinker.generation_config.eos_token_id = None  # exactly --thinker-tokens, as ours
    return model.eval()


def hf_generate(model, pre: OmniPreprocessor, text: str, images, args) -> tuple[list, list, float]:
    """One full generate: (thinker tokens, talker codes up to the first EOS, audio seconds)."""
    seen = {}
    original = model.talker.generate

    def talker_generate(*a, **kw):
        out = original(*a, **kw)
        seen["codes"] = out[0, kw["input_ids"].shape[1] :].tolist()
        return out

    kwargs = pre.generate_kwargs(pre(text, images=images))
    kwargs.pop("attention_mask", None)  # a single unpadded request, as the tests run it
    prompt_len = kwargs["input_ids"].shape[1]
    model.talker.generate = talker_generate
    try:
        torch.manual_seed(SEED)
        with torch.inference_mode():
            sequences, wav = model.generate(
                **kwargs,
                thinker_max_new_tokens=args.thinker_tokens,
                talker_max_new_tokens=args.talker_tokens,
                talker_do_sample=False,
            )
    finally:
        del model.talker.generate
    codes = seen.get("codes", [])
    for i, c in enumerate(codes):
        if c in CODEC_EOS:
            codes = codes[: i + 1]
            break
    return sequences[0, prompt_len:].tolist(), codes, wav.numel() / 24000


def run_hf(model, pre, requests, args) -> dict:
    thinker, codes, audio_s, first = [], [], 0.0, None
    start = time.perf_counter()
    for text, images in requests:
        t, c, a = hf_generate(model, pre, text, images, args)
        thinker.append(t)
        codes.append(c)
        audio_s += a
        if first is None:
            first = time.perf_counter() - start
    wall = time.perf_counter() - start
    return {"wall": wall, "ttfa": first, "thinker": thinker, "codes": codes, "audio_s": audio_s}


def hit(pair: tuple[int, int]) -> str:
    cached, total = pair
    return f"{cached}/{total} ({cached / total:.0%})"


def table(header, rows) -> None:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=True)]
    print("| " + " | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in rows:
        print("| " + " | ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) + " |")


def _param_shapes(model_dir: str):
    """Tensor shapes from the safetensors headers (no weights loaded)."""
    import json
    import struct

    for path in sorted(Path(model_dir).glob("*.safetensors")):
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        yield from (v["shape"] for k, v in header.items() if k != "__metadata__")
