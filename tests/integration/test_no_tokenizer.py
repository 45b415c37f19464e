"""A checkpoint without tokenizer files (vLLM's skip_tokenizer_init): it loads and serves
prompt_token_ids exactly like the same checkpoint with its tokenizer; a text prompt is a clear
ValueError; results carry token ids and no text."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from helpers import on_cpu

from omni.core.sampling_params import SamplingParams
from omni.entrypoints.omni import Omni
from omni.entrypoints.prompt_processor import PromptProcessor, has_tokenizer_files

PROMPTS = [[5, 6, 7, 8], [100, 3, 42], [9] * 12]


def _without_tokenizer(src: str, dst: Path) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("tokenizer*", "vocab*", "merges.txt"))
    names = sorted(p.name for p in dst.iterdir())
    assert "config.json" in names and not any(n.startswith("tokenizer") for n in names), names
    return dst


@pytest.fixture(scope="module")
def bare_dir(qwen2_dir, tmp_path_factory) -> Path:
    assert (Path(qwen2_dir) / "tokenizer.json").exists()  # the original has one
    return _without_tokenizer(qwen2_dir, tmp_path_factory.mktemp("bare") / "qwen2")


def _no_tokenizer_message(where: Path) -> str:
    return f"this model has no tokenizer (no tokenizer files in {where}): give prompt_token_ids"


def test_prompt_processor_without_tokenizer(bare_dir, qwen2_dir):
    assert not has_tokenizer_files(str(bare_dir)) and has_tokenizer_files(qwen2_dir)
    bare, full = PromptProcessor(str(bare_dir)), PromptProcessor(qwen2_dir)
    assert bare.tokenizer is None and full.tokenizer is not None
    for prompt in (PROMPTS[0], {"prompt_token_ids": PROMPTS[1], "cache_salt": "s"}):
        assert bare("r", prompt) == full("r", prompt)
    for prompt in ("Hello", {"prompt": "Hello"}):
        with pytest.raises(ValueError) as info:
            bare("req-9", prompt)
        assert str(info.value) == f"prompt 'req-9': {_no_tokenizer_message(bare_dir)}"
    # Other prompt errors are unchanged.
    with pytest.raises(ValueError, match="prompt_token_ids is empty"):
        bare("r", {"prompt_token_ids": []})


def test_unreadable_tokenizer_files_still_raise(qwen2_dir, tmp_path):
    """Only "no tokenizer files" means no tokenizer: a broken one is an error, not None."""
    broken = _without_tokenizer(qwen2_dir, tmp_path / "broken")
    (broken / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(ValueError):  # json.JSONDecodeError
        PromptProcessor(str(broken))


@pytest.mark.slow
def test_token_id_prompts_equal_the_original_checkpoint(bare_dir, qwen2_dir):
    params = [
        SamplingParams(max_tokens=6, ignore_eos=True),
        SamplingParams(max_tokens=6, temperature=0.8, top_k=20, seed=11, ignore_eos=True),
    ]
    with Omni(model=str(bare_dir), runtime={"backend": "local"}, **on_cpu("llm")) as bare:
        assert bare.async_omni.prompt_processor.tokenizer is None
        got = [bare.generate(PROMPTS, p, use_tqdm=False) for p in params]
        with pytest.raises(ValueError) as info:
            bare.generate(["What is the capital of France?"], use_tqdm=False)
        assert _no_tokenizer_message(bare_dir) in str(info.value)
        # The engine still serves token ids after the rejected text prompt.
        (again,) = bare.generate([PROMPTS[0]], params[0], use_tqdm=False)
    with Omni(model=qwen2_dir, runtime={"backend": "local"}, **on_cpu("llm")) as full:
        want = [full.generate(PROMPTS, p, use_tqdm=False) for p in params]
    for outputs, expected in zip(got, want, strict=True):
        for out, ref in zip(outputs, expected, strict=True):
            assert out.error is None and ref.error is None
            assert out.final.prompt_token_ids == ref.final.prompt_token_ids
            assert out.final.token_ids == ref.final.token_ids and len(out.final.token_ids) == 6
            assert out.final.finish_reason == ref.final.finish_reason
            assert out.final.text is None and isinstance(ref.final.text, str)
    assert again.final.token_ids == want[0][0].final.token_ids
