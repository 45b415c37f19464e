"""Build tiny random-weight HF checkpoints offline and deterministically from a seed.

Library::

    from tools.make_tiny_checkpoint import ensure_checkpoint
    path = ensure_checkpoint("qwen2", "tiny", seed=0)   # builds once, then returns at once

CLI::

    python tools/make_tiny_checkpoint.py --family qwen2 --size tiny --seed 0 [--out DIR]

Families: ``qwen2`` and ``llama`` (``AutoModelForCausalLM`` + ``AutoTokenizer`` directories, see
``tools/tiny_lm.py``) and ``qwen2_5_omni`` (``Qwen2_5OmniForConditionalGeneration`` directory
with tokenizer, processor configs and ``spk_dict.pt``; see ``tools/tiny_omni.py`` for how to
preprocess images and audio without torchvision) and ``qwen3_omni_moe``
(``Qwen3OmniMoeForConditionalGeneration`` directory, tiny size only; see
``tools/tiny_qwen3_omni.py`` for the config fields transformers reads but does not declare). Sizes: ``tiny`` (tests) and ``bench``.

Cache: ``<repo>/.cache/checkpoints/<family>-<size>-seed<seed>/``; the env var ``OMNI_CACHE_DIR``
replaces ``<repo>/.cache``. A directory is built into a temporary sibling and renamed into place,
so parallel or interrupted builds never leave a half-written checkpoint. The file
``.tiny_ckpt_version`` inside records the builder version; a stale one is rebuilt.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pathlib
import shutil
import sys
import tempfile
from collections.abc import Callable

FAMILIES = ("qwen2", "llama", "qwen2_5_omni", "qwen3_omni_moe")
SIZES = ("tiny", "bench")
# Bump when the generated content changes, so cached directories from older builders are rebuilt.
BUILD_VERSION = "2"
_VERSION_FILE = ".tiny_ckpt_version"
_REPO = pathlib.Path(__file__).resolve().parent.parent


def _check(family: str, size: str, seed: int) -> None:
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; valid families: {', '.join(FAMILIES)}")
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; valid sizes: {', '.join(SIZES)}")
    if not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")


def cache_root() -> pathlib.Path:
    """Directory holding all checkpoints: ``$OMNI_CACHE_DIR/checkpoints`` or the repo's."""
    base = os.environ.get("OMNI_CACHE_DIR")
    return (pathlib.Path(base) if base else _REPO / ".cache") / "checkpoints"


def checkpoint_dir(family: str, size: str = "tiny", seed: int = 0) -> pathlib.Path:
    """Where ``ensure_checkpoint`` puts (or finds) this checkpoint; does not build it."""
    _check(family, size, seed)
    return cache_root() / f"{family}-{size}-seed{seed}"


def build_checkpoint(family: str, size: str, seed: int, out_dir: str | os.PathLike) -> int:
    """Write the checkpoint files into ``out_dir`` (created if needed); return #parameters."""
    _check(family, size, seed)
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    # Imported lazily: importing this module (e.g. to get a path) must not pull in torch.
    from transformers.utils import logging as hf_logging

    bars, level = hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()  # "Writing model shards" bars would clutter test output
    # Saving diffs each sub-config against a default one, whose Qwen2.5-Omni default token ids
    # trigger "must be within the vocabulary" warnings that say nothing about our files.
    hf_logging.set_verbosity_error()
    try:
        if family == "qwen2_5_omni":
            from tools import tiny_omni

            n = tiny_omni.build_omni(size, seed, out)
        elif family == "qwen3_omni_moe":
            from tools import tiny_qwen3_omni

            n = tiny_qwen3_omni.build_omni(size, seed, out)
        else:
            from tools import tiny_lm

            n = tiny_lm.build_lm(family, size, seed, out)
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()
    (out / _VERSION_FILE).write_text(BUILD_VERSION + "\n")
    return n


def _is_current(path: pathlib.Path) -> bool:
    marker = path / _VERSION_FILE
    return marker.is_file() and marker.read_text().strip() == BUILD_VERSION


def ensure_checkpoint(family: str, size: str = "tiny", seed: int = 0) -> pathlib.Path:
    """Return the cached checkpoint directory, building it first if missing or stale."""
    final = checkpoint_dir(family, size, seed)
    return cached_build(final, _is_current, lambda tmp: build_checkpoint(family, size, seed, tmp))


def cached_build(
    final: pathlib.Path,
    is_current: Callable[[pathlib.Path], bool],
    build: Callable[[pathlib.Path], object],
) -> pathlib.Path:
    """`final`, built by `build(tmp_dir)` unless `is_current(final)` already. Parallel callers
    are safe: each builds into a temporary sibling and renames it into place; a stale directory
    is moved aside first; the first rename wins (the builds are identical)."""
    if is_current(final):
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        tmp.chmod(0o755)  # mkdtemp makes it private; the cache is meant to be shared
        build(tmp)
        if final.exists() and not is_current(final):
            # Stale builder version: move it aside first (rename is atomic), then delete it.
            trash = pathlib.Path(tempfile.mkdtemp(prefix=f".{final.name}.old-", dir=final.parent))
            with contextlib.suppress(OSError):  # another process replaced it concurrently
                os.rename(final, trash / "old")
            shutil.rmtree(trash, ignore_errors=True)
        try:
            os.rename(tmp, final)
        except OSError:
            # A parallel build won the race; its result is identical, keep it.
            if not is_current(final):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", required=True, choices=FAMILIES)
    parser.add_argument("--size", default="tiny", choices=SIZES)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="write here instead of the cache")
    args = parser.parse_args(argv)
    if args.out is not None:
        path = pathlib.Path(args.out)
        if path.exists() and any(path.iterdir()):
            parser.error(f"--out {path} exists and is not empty")
        build_checkpoint(args.family, args.size, args.seed, path)
    else:
        path = ensure_checkpoint(args.family, args.size, args.seed)
    print(path)
    print(f"parameters: {count_parameters(path):,}")
    return 0


def count_parameters(path: str | os.PathLike) -> int:
    """Number of parameters stored in a checkpoint's safetensors files (no model build)."""
    from safetensors import safe_open

    total = 0
    for f in sorted(pathlib.Path(path).glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as st:
            for key in st.keys():  # noqa: SIM118 - safe_open is not a dict
                n = 1
                for d in st.get_slice(key).get_shape():
                    n *= d
                total += n
    return total


if __name__ == "__main__":
    # Run as a script: make the repo importable so that ``tools.*`` helpers resolve.
    sys.path.insert(0, str(_REPO))
    sys.exit(main())
