"""`omni serve` end to end: real server subprocesses on 127.0.0.1 (a free port, the local
backend), driven with the official `openai` client (and httpx where the client cannot send the
malformed request). Two servers per module: the tiny Qwen2.5-Omni (text + speech) and the tiny
Qwen2 (a plain LM, text only).

References are computed in this process with `Omni(...).generate` on the same prompt dict the
server builds (`omni.entrypoints.openai.prompts.chat_prompt`) and the same per-stage sampling
(greedy, fixed lengths, a fixed vocoder seed), so text and waveforms compare exactly (waveforms
within one int16 step: two processes round the same floats). All on the CPU, GPU or not.
"""

from __future__ import annotations

import base64
import contextlib
import io
import threading
import time
import wave
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import openai
import pytest
import torch
from helpers import OMNI_ON_CPU, cli_sets, on_cpu
from prometheus_client.parser import text_string_to_metric_families
from server_support import (
    AUDIO,
    BAD,
    EXTRA,
    GOOD,
    KEY,
    LM_NAME,
    OMNI_NAME,
    PARAMS,
    PATHS,
    THINKER,
    VOICE,
    data_url,
    png,
    wav,
)

from omni import Omni
from omni.core.sampling_params import SamplingParams
from omni.entrypoints.openai.audio_encoding import pcm16
from omni.entrypoints.openai.prompts import chat_prompt
from tools.make_tiny_checkpoint import ensure_checkpoint
from tools.serve_process import ServeProcess

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    media = tmp_path_factory.mktemp("media")
    (media / "cat.png").write_bytes(png(1))
    return {
        "omni": str(ensure_checkpoint("qwen2_5_omni", "tiny")),
        "lm": str(ensure_checkpoint("qwen2", "tiny", 0)),
        "media": str(media),
    }


@pytest.fixture(scope="module")
def servers(dirs):
    """Both servers, started together (their start-ups overlap)."""
    local = ["--set", "runtime.backend=local"]
    omni = ServeProcess(
        ["--model", dirs["omni"], "--served-model-name", OMNI_NAME, "--api-key", KEY, *local]
        + ["--allowed-local-media-path", dirs["media"], *cli_sets(OMNI_ON_CPU)]
    ).start()
    lm = ServeProcess(
        ["--model", dirs["lm"], "--served-model-name", LM_NAME, *local, *cli_sets(on_cpu("llm"))]
    ).start()
    try:
        omni.wait_ready()
        lm.wait_ready()
        yield {"omni": omni, "lm": lm}
    finally:
        omni.stop()
        lm.stop()


@pytest.fixture(scope="module")
def client(servers):
    return openai.OpenAI(base_url=servers["omni"].base_url + "/v1", api_key=KEY, max_retries=0)


@pytest.fixture(scope="module")
def lm_client(servers):
    return openai.OpenAI(base_url=servers["lm"].base_url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def reference(dirs):
    """Omni.generate in this process (one torch thread, as the servers)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with Omni(model=dirs["omni"], runtime={"backend": "local"}, **OMNI_ON_CPU) as omni:
        yield omni
    torch.set_num_threads(threads)


def _messages(text: str) -> list[dict]:
    return [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": text},
    ]


def _reference(reference, messages, **extra):
    prompt = chat_prompt(reference.async_omni.prompt_processor.tokenizer, messages) | extra
    (out,) = reference.generate([prompt], PARAMS, use_tqdm=False)
    assert out.error is None
    return out


def test_health_and_models(servers, client):
    assert httpx.get(servers["omni"].base_url + "/health").status_code == 200
    assert [m.id for m in client.models.list().data] == [OMNI_NAME]


def test_chat_text_stream_equals_non_stream_equals_omni(client, reference):
    messages = _messages("tell me about the sea and the sky")
    kwargs = dict(model=OMNI_NAME, messages=messages, max_tokens=THINKER, temperature=0)
    full = client.chat.completions.create(**kwargs, extra_body=EXTRA)
    chunks = list(
        client.chat.completions.create(
            **kwargs, extra_body=EXTRA, stream=True, stream_options={"include_usage": True}
        )
    )
    ref = _reference(reference, messages)
    text = full.choices[0].message.content
    assert text == ref.stages["thinker"].text
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert full.choices[0].message.audio is None
    assert full.choices[0].finish_reason == "length"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    usage = full.usage
    assert usage.prompt_tokens == len(ref.stages["thinker"].prompt_token_ids)
    assert usage.completion_tokens == THINKER
    assert usage.total_tokens == usage.prompt_tokens + THINKER
    assert chunks[-1].usage.completion_tokens == THINKER and not chunks[-1].choices


def test_chat_audio_matches_omni_waveform(client, reference):
    messages = _messages("say something about trees")
    kwargs = dict(
        model=OMNI_NAME,
        messages=messages,
        max_tokens=THINKER,
        modalities=["text", "audio"],
        audio={"voice": VOICE, "format": "wav"},
        extra_body=EXTRA,
    )
    full = client.chat.completions.create(**kwargs)
    ref = _reference(reference, messages, speaker=VOICE)
    expected = pcm16(ref.final.audio).astype(np.int32)
    audio = full.choices[0].message.audio
    with wave.open(io.BytesIO(base64.b64decode(audio.data))) as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (24000, 1, 2)
        samples = np.frombuffer(w.readframes(w.getnframes()), "<i2").astype(np.int32)
    assert len(samples) == len(expected) > 0
    assert np.abs(samples - expected).max() <= 1
    assert audio.transcript == full.choices[0].message.content == ref.stages["thinker"].text
    assert audio.expires_at > time.time()
    # Streamed audio (the streaming path): test_server_audio_stream.py.


def test_image_and_audio_inputs(client, dirs, reference):
    content = [
        {"type": "image_url", "image_url": {"url": data_url(png())}},
        {
            "type": "input_audio",
            "input_audio": {"data": base64.b64encode(wav()).decode(), "format": "wav"},
        },
        {"type": "text", "text": "what do you see and hear?"},
    ]
    messages = [{"role": "user", "content": content}]
    out = client.chat.completions.create(
        model=OMNI_NAME, messages=messages, max_tokens=THINKER, extra_body=EXTRA
    )
    ref = _reference(reference, messages)
    assert out.choices[0].message.content == ref.stages["thinker"].text
    assert out.usage.prompt_tokens == len(ref.stages["thinker"].prompt_token_ids) > 40
    local = [
        {"type": "image_url", "image_url": {"url": f"file://{dirs['media']}/cat.png"}},
        {"type": "text", "text": "and this one?"},
    ]
    out = client.chat.completions.create(
        model=OMNI_NAME, messages=[{"role": "user", "content": local}], max_tokens=4
    )
    assert out.usage.prompt_tokens > 10


def test_32_concurrent_clients(client, reference):
    prompts = [f"question {i}: " + "tell me more " * (i % 5 + 1) for i in range(32)]
    cheap = [PARAMS[0], SamplingParams(max_tokens=1), SamplingParams(max_tokens=1)]
    tok = reference.async_omni.prompt_processor.tokenizer
    refs = reference.generate(
        [chat_prompt(tok, _messages(p)) for p in prompts], cheap, use_tqdm=False
    )

    def ask(i: int) -> str:
        kwargs = dict(model=OMNI_NAME, messages=_messages(prompts[i]), max_tokens=THINKER)
        if i % 2:
            stream = client.chat.completions.create(**kwargs, extra_body=EXTRA, stream=True)
            return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        out = client.chat.completions.create(**kwargs, extra_body=EXTRA)
        return out.choices[0].message.content

    with ThreadPoolExecutor(32) as pool:
        answers = list(pool.map(ask, range(32)))
    assert answers == [r.stages["thinker"].text for r in refs]


def test_max_tokens_beyond_the_context_is_a_400(client, reference):
    """As OpenAI and vLLM: a request that cannot fit the thinker's context is refused, naming
    max_tokens, the prompt length and the limit, not silently cut (the Python API caps)."""
    limit = reference.async_omni.config.stage("thinker").engine.max_model_len
    chat = dict(model=OMNI_NAME, messages=_messages("how long can you go on?"))
    text = dict(model=OMNI_NAME, prompt="once upon a time")
    num_chat = client.chat.completions.create(**chat, max_tokens=1).usage.prompt_tokens
    num_text = client.completions.create(**text, max_tokens=1).usage.prompt_tokens
    cases = [  # (param, value, prompt length, the call)
        ("max_tokens", limit - num_chat + 1, num_chat, client.chat.completions.create, chat),
        ("max_completion_tokens", 30000, num_chat, client.chat.completions.create, chat),
        ("max_tokens", limit, num_text, client.completions.create, text),
    ]
    for param, value, num_prompt, create, kwargs in cases:
        for stream in (False, True):
            with pytest.raises(openai.BadRequestError) as caught:
                create(**kwargs, **{param: value}, stream=stream)
            error = caught.value
            assert (error.param, error.code) == (param, "context_length_exceeded"), error
            for part in (
                f"{param} is too large: {value}.",
                f"maximum context length is {limit} tokens",
                f"the prompt has {num_prompt} tokens",
            ):
                assert part in error.message, (part, error.message)


def test_prefix_cache_and_cache_salt(client):
    long = "a long shared document about rivers, mountains and the weather. " * 12

    def cached(salt: str | None) -> int:
        extra = {"cache_salt": salt} if salt else {}
        out = client.chat.completions.create(
            model=OMNI_NAME, messages=_messages(long), max_tokens=2, extra_body=extra
        )
        return out.usage.prompt_tokens_details.cached_tokens

    cached(None)
    assert cached(None) > 100
    assert cached("another-user") == 0
    assert cached("another-user") > 100


def test_completions_plain_lm(lm_client, dirs):
    prompt = "The quick brown fox"
    kwargs = dict(model=LM_NAME, prompt=prompt, max_tokens=6, temperature=0)
    extra = {"stage_sampling": {"llm": {"ignore_eos": True}}}
    full = lm_client.completions.create(**kwargs, extra_body=extra)
    stream = lm_client.completions.create(**kwargs, extra_body=extra, stream=True)
    joined = "".join(c.choices[0].text for c in stream if c.choices)
    hot = {**kwargs, "temperature": 1.5, "seed": 7}  # top_k 1: greedy; -1 (vLLM's): no top-k
    top_1 = lm_client.completions.create(**hot, extra_body={**extra, "top_k": 1})
    wide = lm_client.completions.create(**hot, extra_body={**extra, "top_k": -1})
    # OpenAI's penalties reach the text stage (24 tokens: enough for them to change the text).
    penalties = {"presence_penalty": 1.8, "frequency_penalty": 0.4, "logit_bias": {"7": 3.0}}
    longer = {**kwargs, "max_tokens": 24}
    served = lm_client.completions.create(**longer, **penalties, extra_body=extra)
    plain = lm_client.completions.create(**longer, extra_body=extra)
    greedy = SamplingParams(max_tokens=6, ignore_eos=True)
    with Omni(model=dirs["lm"], runtime={"backend": "local"}, **on_cpu("llm")) as lm:
        (ref,) = lm.generate([prompt], greedy, use_tqdm=False)
        params = SamplingParams(max_tokens=24, ignore_eos=True, **penalties)
        (penalized,) = lm.generate([prompt], params, use_tqdm=False)
    assert full.choices[0].text == joined == ref.final.text == top_1.choices[0].text
    assert full.usage.completion_tokens == 6 and wide.choices[0].text != ref.final.text
    assert served.choices[0].text == penalized.final.text != plain.choices[0].text
    chat = lm_client.chat.completions.create(model=LM_NAME, messages=_messages("hi"), max_tokens=3)
    assert chat.usage.completion_tokens <= 3


def test_bad_requests_name_the_field(servers, client):
    failures = []
    with httpx.Client(headers={"Authorization": f"Bearer {KEY}"}, timeout=60) as http:
        for name, server, path, body, status, param in BAD:
            r = http.post(servers[server].base_url + PATHS[path], json=body)
            error = (
                r.json().get("error", {})
                if r.headers.get("content-type", "").startswith("application/json")
                else {}
            )
            if r.status_code != status or error.get("param") != param or not error.get("message"):
                failures.append((name, r.status_code, r.text[:300]))
        # not JSON at all; and a body over the 32 MiB limit
        r = http.post(servers["omni"].base_url + PATHS["chat"], content=b"{not json")
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
        r = http.post(servers["omni"].base_url + PATHS["chat"], content=b"x" * (33 << 20))
        assert r.status_code == 413, r.text
    assert not failures, failures
    assert len(BAD) >= 15
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=client.base_url, api_key="wrong", max_retries=0).models.list()
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=_messages("x"))
    # the server still answers, correctly
    out = client.chat.completions.create(**GOOD)
    assert out.usage.completion_tokens <= 2 and out.choices[0].message.content is not None


def _metrics(server) -> dict[str, float]:
    text = httpx.get(server.base_url + "/metrics").text
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


def test_disconnect_mid_stream_aborts(servers, client):
    body = {
        **GOOD,
        **AUDIO,
        "audio": {"voice": VOICE, "format": "pcm16"},  # the one streamed audio format
        "max_tokens": 8,
        "stream": True,
        "stage_sampling": {
            "thinker": {"ignore_eos": True},
            "talker": {"max_tokens": 3000, "ignore_eos": True},
        },
    }
    server = servers["omni"]
    seen_running = 0.0
    headers = {"Authorization": f"Bearer {KEY}"}
    with (
        httpx.Client(headers=headers, timeout=60) as http,
        http.stream("POST", server.base_url + PATHS["chat"], json=body) as r,
    ):
        for n, _ in enumerate(r.iter_lines()):
            if n >= 4:  # text is flowing: the talker's 3000 steps are next
                seen_running = _metrics(server)["omni_requests_running"]
                break
    assert seen_running >= 1
    deadline = time.monotonic() + 20
    while True:
        m = _metrics(server)
        blocks = sum(v for k, v in m.items() if k.startswith("omni_stage_kv_blocks_in_use"))
        if m["omni_requests_running"] == 0 and blocks == 0:
            break
        assert time.monotonic() < deadline, m
        time.sleep(0.1)


def test_metrics_parse_and_move(servers, client):
    server, chat = servers["omni"], "{endpoint=/v1/chat/completions}"
    before = _metrics(server)
    client.chat.completions.create(**GOOD, stream=False)
    list(client.chat.completions.create(**GOOD, stream=True))
    client.chat.completions.create(**GOOD, **AUDIO)  # its own audio and error, whatever ran first
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(**{**GOOD, "messages": []})
    after = _metrics(server)
    moved = {k: after[k] - before.get(k, 0) for k in after}
    assert moved[f"omni_requests_total{chat}"] == 4  # the bad one counts too
    assert moved[f"omni_time_to_first_token_seconds_count{chat}"] >= 1
    assert moved[f"omni_e2e_request_latency_seconds_count{chat}"] >= 3
    assert moved[f"omni_time_to_first_audio_seconds_count{chat}"] >= 1
    assert moved["omni_stage_kv_queried_tokens{stage=thinker}"] > 0
    assert after["omni_stage_kv_hit_tokens{stage=thinker}"] > 0  # the repeated long prompt
    assert "omni_stage_output_hit_rows{stage=talker}" in after
    assert moved["omni_request_errors_total{endpoint=/v1/chat/completions,status=400}"] == 1


def test_sigterm_stops_cleanly(servers, lm_client):
    """Last in the module: stops the plain-LM server (in-flight requests do not block it)."""
    server = servers["lm"]
    started = threading.Event()

    def busy() -> None:
        started.set()
        with contextlib.suppress(openai.OpenAIError):
            lm_client.completions.create(model=LM_NAME, prompt="x", max_tokens=200)

    thread = threading.Thread(target=busy)
    thread.start()
    started.wait()
    time.sleep(0.2)
    t0 = time.monotonic()
    assert server.stop(timeout=30) == 0, server.output()
    assert time.monotonic() - t0 < 30
    thread.join(30)
    assert sum(line.startswith("omni: serving") for line in server.lines) == 1
