"""`omni serve`'s model-free parts: CLI config errors (exit 2 before any model loads), request
parsing into OpenAI-shaped errors, the prompt builder, audio encoding. The server itself is
covered end to end by tests/integration/test_server.py."""

from __future__ import annotations

import base64
import io
import json
import wave
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from omni.entrypoints.cli import main
from omni.entrypoints.openai import audio_encoding
from omni.entrypoints.openai.args import ServerArgs
from omni.entrypoints.openai.errors import OpenAIError, from_validation_error, param_path
from omni.entrypoints.openai.prompts import chat_prompt
from omni.entrypoints.openai.protocol import ChatCompletionRequest

REPO = Path(__file__).resolve().parents[2]


def test_serve_config_errors_exit_2(tmp_path, capsys, qwen2_dir):
    assert main(["serve"]) == 2  # neither CONFIG nor --model
    assert "--model" in capsys.readouterr().err
    assert main(["serve", str(tmp_path / "missing.yaml")]) == 2
    assert main(["serve", "--model", str(tmp_path / "no-checkpoint")]) == 2
    bad = ["serve", str(REPO / "stage_configs" / "tiny_causal_lm.yaml"), "--set", "nokey"]
    assert main(bad) == 2
    capsys.readouterr()
    assert main(["serve", "--model", qwen2_dir, "--max-tokens", "0"]) == 2  # before it loads
    assert "--max-tokens must be >= 1, got 0" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:  # argparse's choices, before it loads
        main(["serve", "--model", qwen2_dir, "--tool-call-parser", "llama3"])
    assert exit_info.value.code == 2
    assert "--tool-call-parser: invalid choice: 'llama3'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="tool_call_parser must be one of .* got 'mistral'"):
        ServerArgs("m", tool_call_parser="mistral")


def _error(body: dict) -> dict:
    with pytest.raises(ValidationError) as e:
        ChatCompletionRequest.model_validate_json(json.dumps(body))
    return from_validation_error(e.value.errors()).body()["error"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": [{"role": "user", "content": "x"}]}, "model"),
        ({"model": "m", "messages": [{"role": "bot", "content": "x"}]}, "messages[0].role"),
        (
            {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": "5"},
            "max_tokens",
        ),
        ({"model": "m", "messages": [{"role": "user", "content": "x"}], "foo": 1}, "foo"),
        (
            {
                "model": "m",
                "messages": [
                    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": 3}}]}
                ],
            },
            "messages[0].content[0].image_url.url",
        ),
    ],
)
def test_validation_errors_name_the_field(body, param):
    error = _error(body)
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert error["message"]


def test_param_path_drops_union_tags():
    assert param_path(("stop", "list[str]", 0)) == "stop[0]"


def test_chat_prompt_qwen_framing_and_media():
    class Tok:  # no chat template: the Qwen framing
        chat_template = None
        image_token = "<|IMAGE|>"
        audio_token = "<|AUDIO|>"

    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(16000)
        f.writeframes(np.zeros(1600, "<i2").tobytes())
    from PIL import Image

    png = io.BytesIO()
    Image.new("RGB", (8, 8)).save(png, format="PNG")
    content = [
        {"type": "text", "text": "look: "},
        {
            "type": "image_url",
            "image_url": {
                "url": "data:image/png;base64," + base64.b64encode(png.getvalue()).decode()
            },
        },
        {
            "type": "input_audio",
            "input_audio": {"data": base64.b64encode(buffer.getvalue()).decode(), "format": "wav"},
        },
    ]
    prompt = chat_prompt(
        Tok(), [{"role": "developer", "content": "be brief"}, {"role": "user", "content": content}]
    )
    assert prompt["prompt"] == (
        "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nlook: "
        "<|vision_bos|><|IMAGE|><|vision_eos|><|audio_bos|><|AUDIO|><|audio_eos|><|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert prompt["images"] == [png.getvalue()] and prompt["audio"] == [buffer.getvalue()]
    remote = [{"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]
    with pytest.raises(OpenAIError) as e:
        chat_prompt(Tok(), [{"role": "user", "content": remote}], ServerArgs(model_name="m"))
    assert e.value.status == 400 and e.value.param == "messages[0].content[0].image_url"


def test_audio_encoding_matches_write_wav(tmp_path):
    from omni.audio import write_wav

    audio = np.sin(np.arange(1000) / 7.0) * 1.2  # some samples clip
    write_wav(tmp_path / "a.wav", audio, 24000)
    assert audio_encoding.wav_bytes(audio, 24000) == (tmp_path / "a.wav").read_bytes()
    pcm = audio_encoding.pcm16_bytes(audio)
    assert b"".join(audio_encoding.chunks(pcm, 64)) == pcm


def test_openai_fields_at_their_defaults_are_served_others_named():
    """Clients send some OpenAI fields at their defaults (a text response format, no
    tools...): accepted, where anything else is a 400 naming the field (the
    bad-request table in tests/integration/server_support.py sends those through the server)."""
    from omni.entrypoints.openai.chat import _unsupported

    base = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    defaults = {
        "logprobs": False, "top_logprobs": 0, "response_format": {"type": "text"}, "tools": [],
        "tool_choice": "none", "parallel_tool_calls": True, "store": False, "metadata": {"a": "b"},
    }  # fmt: skip
    body = ChatCompletionRequest.model_validate({**base, **defaults})
    assert all(served for _, _, served in _unsupported(body))
    others = {"store": True}  # tools: omni/entrypoints/openai/tools.py, tests/integration
    for name, value in others.items():
        body = ChatCompletionRequest.model_validate({**base, name: value})
        assert [n for n, _, served in _unsupported(body) if not served] == [name]
