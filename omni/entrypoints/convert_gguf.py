"""`omni convert-gguf GGUF OUT_DIR`: a GGUF checkpoint (e.g. llama.cpp's Q4_1) as a transformers
safetensors directory (config, generation config, weights, tokenizer with its chat template) that
`Omni(model=OUT_DIR)` and `AutoModelForCausalLM.from_pretrained` load.

transformers dequantizes GGUF weights while loading (it needs the `gguf` package, in the `real`
extra), but a model loaded that way keeps a GGUF `quantization_config` and its `save_pretrained`
fails. So the converter builds a fresh model from the same config without the quantization
settings, loads the dequantized state dict into it, and saves that. Weights are float32 by
default: Q4_1 values (`scale * q + min` with fp16 scale and min) are exact in float32 only.
"""

from __future__ import annotations

import copy
import importlib.util
import os
import pathlib
import shutil
import tempfile

DTYPES = ("float32", "bfloat16", "float16")


def convert_gguf(
    gguf_path: str | os.PathLike, out_dir: str | os.PathLike, *, dtype: str = "float32"
) -> pathlib.Path:
    """Write a transformers safetensors checkpoint (weights, config, tokenizer) of ``gguf_path``
    into ``out_dir`` and return ``out_dir``.

    ``out_dir`` must not exist or be empty. The files are written into a temporary sibling that
    is renamed into place, so an interrupted conversion never leaves a half-written directory.
    Raises FileNotFoundError (no such GGUF file), FileExistsError (``out_dir`` not empty),
    ValueError (bad dtype, or not a causal LM) and ImportError (``gguf`` not installed).
    """
    src = pathlib.Path(gguf_path).expanduser()
    out = pathlib.Path(out_dir).expanduser()
    if not src.is_file():
        raise FileNotFoundError(f"GGUF file {str(src)!r} does not exist")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"output directory {str(out)!r} exists and is not empty")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        tmp.chmod(0o755)  # mkdtemp makes it private
        write_checkpoint(src, tmp, dtype=dtype)
        if out.exists():
            out.rmdir()  # empty (checked above); os.rename cannot replace a directory on all OSes
        os.rename(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def write_checkpoint(gguf_path: pathlib.Path, out: pathlib.Path, *, dtype: str = "float32") -> None:
    """The conversion itself: the checkpoint files of ``gguf_path`` written into directory ``out``
    (created if needed; existing files of the same names are overwritten)."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if importlib.util.find_spec("gguf") is None:
        raise ImportError(
            "converting a GGUF file needs the 'gguf' package: pip install gguf accelerate "
            "(or omni's extra: pip install -e '.[real]')"
        )
    # Imported lazily: importing this module (e.g. for a path) must not pull in torch.
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    folder, name = str(gguf_path.parent), gguf_path.name
    bars, level = hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()  # "de-quantizing GGUF tensors" bars clutter the output
    hf_logging.set_verbosity_error()
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        try:
            quantized = AutoModelForCausalLM.from_pretrained(
                folder, gguf_file=name, dtype=torch.float32
            )
        except ValueError as e:  # e.g. an architecture transformers cannot read from GGUF
            raise ValueError(f"cannot load {str(gguf_path)!r} as a causal LM: {e}") from e
        state = quantized.state_dict()
        # The same architecture without the GGUF quantization settings, which save_pretrained
        # cannot serialize; its random initial weights are all replaced below.
        config = copy.deepcopy(quantized.config)
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        # GGUF's general.name ("Smollm2 135M 8k ..."), which transformers keeps as
        # _model_name_or_path: not a path, and it would look like one in config.json.
        config.__dict__.pop("_model_name_or_path", None)
        generation_config = copy.deepcopy(quantized.generation_config)
        del quantized
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        missing, unexpected = model.load_state_dict(state, strict=False)
        # Tied weights (lm_head = embed_tokens) may be stored once; anything else must match.
        tied = set(getattr(model, "_tied_weights_keys", None) or ())
        missing = [k for k in missing if k not in tied]
        if missing or unexpected:
            raise ValueError(
                f"{str(gguf_path)!r}: dequantized weights do not fit the model built from its "
                f"config (missing {missing[:5]}, unexpected {unexpected[:5]})"
            )
        model.tie_weights()
        model = model.to(getattr(torch, dtype)).eval()
        model.generation_config = generation_config
        out.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
        for file in out.iterdir():
            file.chmod(0o644)  # safetensors' files are private; a converted model is not
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()
