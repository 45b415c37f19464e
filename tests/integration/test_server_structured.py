"""vLLM's structured outputs over HTTP with the official `openai` client (`extra_body`), against
the tiny Qwen2 served in-process: `structured_outputs.choice` (and `guided_choice`) replies equal
the Python API's with the same choice (SamplingParams.json_schema's CHOICE, checked against
transformers in tests/integration/test_json_output.py), on chat and completions, whole and
streamed; `structured_outputs.json` equals chat's response_format json_schema; what is not
served is a 400 naming the field."""

from __future__ import annotations

import openai
import pytest
from fastapi.testclient import TestClient
from helpers import on_cpu

from omni import AsyncOmni, Omni
from omni.core.json_schema import CHOICE
from omni.core.sampling_params import SamplingParams
from omni.entrypoints.openai.app import build_app
from omni.entrypoints.openai.args import ServerArgs

pytestmark = pytest.mark.slow
NAME, MAX = "lm", 12
CHOICES = ["positive", "negative", "neutral, mostly"]
MESSAGES = [{"role": "user", "content": "How does this review sound?"}]
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


@pytest.fixture(scope="module")
def client(qwen2_dir):
    engine = AsyncOmni(model=qwen2_dir, runtime={"backend": "local"}, **on_cpu("llm"))
    try:
        with TestClient(build_app(engine, ServerArgs(NAME))) as http:
            yield openai.OpenAI(base_url="http://testserver/v1", api_key="-", http_client=http)
    finally:
        engine.shutdown()


@pytest.fixture(scope="module")
def expected(qwen2_dir) -> dict[str, str]:
    """The Python API's replies constrained to CHOICES: to MESSAGES, and to a raw prompt."""
    params = SamplingParams(max_tokens=MAX, json_schema={CHOICE: CHOICES})
    with Omni(model=qwen2_dir, runtime={"backend": "local"}, **on_cpu("llm")) as lm:
        (chat,) = lm.chat(MESSAGES, params, use_tqdm=False)
        (raw,) = lm.generate(["The review was"], params, use_tqdm=False)
    return {"chat": chat.final.text, "completion": raw.final.text}


def test_a_choice_reply_is_the_python_apis(client, expected):
    assert expected["chat"] in CHOICES and expected["completion"] in CHOICES
    for extra in ({"structured_outputs": {"choice": CHOICES}}, {"guided_choice": CHOICES}):
        kwargs = dict(model=NAME, max_tokens=MAX, temperature=0, extra_body=extra)
        chat = client.chat.completions.create(messages=MESSAGES, **kwargs)
        assert chat.choices[0].message.content == expected["chat"], extra
        assert chat.choices[0].finish_reason == "stop"
        chunks = client.chat.completions.create(messages=MESSAGES, stream=True, **kwargs)
        assert (
            "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            == (expected["chat"])
        )
        done = client.completions.create(prompt="The review was", **kwargs)
        assert done.choices[0].text == expected["completion"], extra
        chunks = client.completions.create(prompt="The review was", stream=True, **kwargs)
        assert "".join(c.choices[0].text for c in chunks if c.choices) == expected["completion"]


def test_a_json_constraint_is_chats_response_format(client):
    kwargs = dict(model=NAME, messages=MESSAGES, max_tokens=MAX, temperature=0)
    schema_format = {"type": "json_schema", "json_schema": {"name": "r", "schema": SCHEMA}}
    want = client.chat.completions.create(**kwargs, response_format=schema_format)
    for extra in ({"structured_outputs": {"json": SCHEMA}}, {"guided_json": SCHEMA},
                  {"structured_outputs": {"json": '{"type": "object", "properties": '
                   '{"n": {"type": "integer"}}, "required": ["n"]}'}}):  # fmt: skip
        got = client.chat.completions.create(**kwargs, extra_body=extra)
        assert got.choices[0].message.content == want.choices[0].message.content, extra
    obj = client.chat.completions.create(**kwargs, response_format={"type": "json_object"})
    got = client.chat.completions.create(
        **kwargs, extra_body={"structured_outputs": {"json_object": True}}
    )
    assert got.choices[0].message.content == obj.choices[0].message.content


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"structured_outputs": {"regex": "[a-z]+"}}, "structured_outputs.regex"),
        ({"structured_outputs": {"grammar": "root ::= x"}}, "structured_outputs.grammar"),
        ({"structured_outputs": {"choices": ["a"]}}, "structured_outputs.choices"),
        ({"structured_outputs": {}}, "structured_outputs"),
        ({"structured_outputs": {"choice": ["a"], "json": {}}}, "structured_outputs"),
        ({"structured_outputs": {"choice": []}}, "structured_outputs.choice"),
        ({"structured_outputs": {"choice": ["a", " b"]}}, "structured_outputs.choice.1"),
        ({"guided_choice": ["a", ""]}, "guided_choice.1"),
        ({"structured_outputs": {"json": "{not json"}}, "structured_outputs.json"),
        ({"structured_outputs": {"json": {"oneOf": []}}}, "structured_outputs.json.oneOf"),
        ({"structured_outputs": {"json_object": False, "choice": ["a"]}, "guided_json": {}},
         "structured_outputs"),
        ({"structured_outputs": {"choice": ["a"]}, "response_format": {"type": "json_object"}},
         "structured_outputs"),
        ({"guided_choice": ["a"], "tool_choice": "required", "tools": [
            {"type": "function", "function": {"name": "f"}}]}, "structured_outputs"),
    ],
)  # fmt: skip
def test_what_is_not_served_is_a_400_naming_the_field(client, extra, param):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model=NAME, messages=MESSAGES, max_tokens=MAX, extra_body=extra
        )
    assert info.value.body["param"] == param, info.value.body
