"""`omni run --model DIR` without a config: plain text and a summary line, --json, the chat
template by default (--raw skips it), and Omni.chat building the same prompt. On the CPU on
any machine (`CPU`); the GPU twin of the pool check is in tests/cuda/test_cuda_engine.py."""

from __future__ import annotations

import json
import shutil

import pytest
from helpers import cli_sets, on_cpu

from omni import Omni, SamplingParams
from omni.entrypoints.cli import main

pytestmark = pytest.mark.slow
CPU = {"runtime.backend": "local", **on_cpu("llm")}

TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def chat_model(qwen2_dir, tmp_path_factory):
    """The tiny qwen2 checkpoint with a chat template in its tokenizer config."""
    path = tmp_path_factory.mktemp("chat") / "ckpt"
    shutil.copytree(qwen2_dir, path)
    config_file = path / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["chat_template"] = TEMPLATE
    config_file.write_text(json.dumps(config))
    return str(path)


def _run_json(capsys, *argv: str) -> dict:
    assert main(["run", *argv, "--max-tokens", "4", *cli_sets(CPU), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_run_prints_text_then_one_summary_line(qwen2_dir, capsys):
    argv = ["run", "--model", qwen2_dir, "--prompt", "hello there", "--max-tokens", "4"]
    assert main([*argv, *cli_sets(CPU)]) == 0
    lines = capsys.readouterr().out.rstrip("\n").split("\n")
    summary = lines[-1]
    assert summary.startswith("[omni] 4 tokens; first token ") and "tokens/s" in summary
    assert "cached prompt tokens: llm 0" in summary
    assert not lines[0].startswith(("'", '"'))  # plain text, not a repr
    with Omni(model=qwen2_dir, **CPU) as llm:
        (want,) = llm.generate("hello there", SamplingParams(max_tokens=4), use_tqdm=False)
    assert "\n".join(lines[:-1]) == want.final.text


def test_chat_template_by_default_raw_without(chat_model, capsys):
    templated = _run_json(capsys, "--model", chat_model, "--prompt", "hi")
    raw = _run_json(capsys, "--model", chat_model, "--prompt", "hi", "--raw")
    with Omni(model=chat_model, **CPU) as llm:
        tokenizer = llm.async_omni.prompt_processor.tokenizer
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
        )
        ids = tokenizer.encode(text, add_special_tokens=False)
        (chat,) = llm.chat([{"role": "user", "content": "hi"}], SamplingParams(max_tokens=4))
        (plain,) = llm.generate({"prompt": text}, SamplingParams(max_tokens=4), use_tqdm=False)
        with pytest.raises(ValueError, match="messages"):
            llm.chat([{"role": "wizard", "content": "hi"}])
    stage = templated["stages"]["llm"]
    assert stage["num_prompt_tokens"] == len(ids) > raw["stages"]["llm"]["num_prompt_tokens"]
    assert chat.stages["llm"].prompt_token_ids == ids
    assert stage["token_ids"] == chat.final.token_ids == plain.final.token_ids
    assert templated["text"] == chat.final.text and templated["error"] is None
    assert "logprobs" not in stage
    asked = _run_json(capsys, "--model", chat_model, "--prompt", "hi", "--set",
                      "stages.llm.sampling.logprobs=2", "--set",
                      "stages.llm.sampling.prompt_logprobs=1")  # fmt: skip
    logprobs = asked["stages"]["llm"]["logprobs"]
    assert [top[0][0] for _, top in logprobs] == stage["token_ids"]  # greedy: its own first
    assert all(len(top) == 2 and lp == top[0][1] for lp, top in logprobs)
    prompt = asked["stages"]["llm"]["prompt_logprobs"]
    assert len(prompt) == len(ids) and prompt[0] is None
    assert all(len(top) == 1 and lp <= top[0][1] for lp, top in prompt[1:])


def test_a_pool_the_machine_cannot_hold_exits_2(qwen2_dir, capsys):
    argv = ["run", "--model", qwen2_dir, "--prompt", "hi", *cli_sets(CPU)]
    assert main([*argv, "--set", "stages.llm.engine.num_blocks=1000000000"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("omni: config error: stage 'llm': stages.llm.engine.num_blocks=")
    assert "bytes are available" in err  # host memory: the stage is on the CPU
