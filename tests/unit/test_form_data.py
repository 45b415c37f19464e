"""form_data.parse_form: multipart bodies as httpx (the openai client's transport) encodes them,
binary files with CRLFs and dashes kept byte for byte, repeated fields in order, and malformed
bodies refused with a 400."""

from __future__ import annotations

import httpx
import pytest

from omni.entrypoints.openai.errors import OpenAIError
from omni.entrypoints.openai.form_data import parse_form

TRICKY = b"RIFF\r\n--\r\n\r\n-- not a boundary \r\n\x00\xff" * 50 + b"\r\n"


def encoded(data: dict, files: dict) -> tuple[bytes, str]:
    request = httpx.Request("POST", "http://x/", data=data, files=files)
    return request.read(), request.headers["content-type"]


def test_fields_and_files_come_back_as_sent():
    body, content_type = encoded(
        {"model": "m", "include[]": ["logprobs", "other"], "prompt": "naïve"},
        {"file": ("a.wav", TRICKY, "audio/wav")},
    )
    form = parse_form(body, content_type)
    assert sorted(form) == ["file", "include[]", "model", "prompt"]
    (file,) = form["file"]
    assert file.data == TRICKY and file.filename == "a.wav"
    assert [p.text() for p in form["include[]"]] == ["logprobs", "other"]
    assert form["prompt"][0].text() == "naïve" and form["model"][0].filename is None
    empty = parse_form(*encoded({"model": ""}, {"file": ("e.wav", b"", "audio/wav")}))
    assert empty["model"][0].data == b"" and empty["file"][0].data == b""
    plain = parse_form(*encoded({"model": "m é", "x": ["1", "2"], "e": ""}, {}))  # URL-encoded
    assert {k: [p.text() for p in v] for k, v in plain.items()} == {
        "model": ["m é"], "x": ["1", "2"], "e": [""]}  # fmt: skip
    assert plain["model"][0].filename is None


@pytest.mark.parametrize(
    ("body", "content_type", "message"),
    [
        (b"{}", "application/json", "must be multipart/form-data"),
        (b"x", "multipart/form-data", "must be multipart/form-data with a boundary"),
        (b"--b\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\nx", "multipart/form-data; boundary=b",
         "not closed"),
        (b"--b\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\nx\r\n--b--", "multipart/form-data; boundary=c",
         "not closed"),
        (b"--b\r\nContent-Disposition: attachment\r\n\r\nx\r\n--b--\r\n", "multipart/form-data; boundary=b",
         "no form-data name"),
        (b"--b\r\nno header end\r\n--b--", "multipart/form-data; boundary=b", "no header end"),
    ],
)  # fmt: skip
def test_malformed_bodies_are_400s(body, content_type, message):
    with pytest.raises(OpenAIError, match=message) as info:
        parse_form(body, content_type)
    assert info.value.status == 400


def test_a_field_that_is_not_utf8_is_named():
    form = parse_form(*encoded({}, {"prompt": (None, b"\xff\xfe", "text/plain")}))
    with pytest.raises(OpenAIError, match="prompt: not UTF-8") as info:
        form["prompt"][0].text()
    assert info.value.body()["error"]["param"] == "prompt"
