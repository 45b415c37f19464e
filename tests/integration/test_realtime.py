"""`/v1/realtime` end to end: real `omni serve` subprocesses (the tiny Qwen2.5-Omni, and the tiny
Qwen2 as a text-only pipeline), driven by the official `openai` client's
`client.realtime.connect`, unchanged.

The reference is AsyncOmni.generate in this process on the chat prompt of the same conversation
(`chat_prompt` of chat messages, spoken turns as 24 kHz WAVs of the same samples, the model's
earlier replies as the text the client was sent), with the stage configs' sampling (greedy) and
the thinker's max_tokens: text equal, audio within one int16 step (two processes round the same
floats). The speech signal is a synthetic vowel-like sound that Silero VAD detects
(realtime_support.speech).
"""

from __future__ import annotations

import asyncio
import json
import signal
import time

import httpx
import numpy as np
import openai
import pytest
from helpers import OMNI_ON_CPU, cli_sets, on_cpu
from prometheus_client.parser import text_string_to_metric_families
from realtime_support import (
    BAD_EVENTS,
    NO_VAD,
    append,
    b64,
    check,
    reference_turn,
    say,
    silence,
    speech,
    turn,
    until,
    user,
)
from server_support import KEY, LM_NAME, OMNI_NAME

from omni.entrypoints.async_omni import AsyncOmni
from tools.make_tiny_checkpoint import ensure_checkpoint
from tools.serve_process import ServeProcess

pytestmark = pytest.mark.slow
# On both sides, the server and the reference: replies of exactly max_output_tokens (the tiny
# model's greedy replies otherwise end in 40-70 tokens, too soon for a cancel to meet them
# running), and shorter speech (16 codes, 0.32 s).
OMNI = {
    **OMNI_ON_CPU,
    "stages.thinker.sampling.ignore_eos": True,
    "stages.talker.sampling.max_tokens": 16,
}
LONG = 4000
"""max_output_tokens of the responses that are cancelled: 7 s of work on an idle 2-core machine,
against IDLE_S for the engine to be idle once one is cancelled or left (an abort, not the end)."""
IDLE_S = 4.0


@pytest.fixture(scope="module")
def servers(omni_dir):
    local = ["--set", "runtime.backend=local"]
    omni = ServeProcess(
        ["--model", omni_dir, "--served-model-name", OMNI_NAME, "--api-key", KEY, *local]
        + cli_sets(OMNI)
    ).start()
    lm_dir = str(ensure_checkpoint("qwen2", "tiny", 0))
    lm = ServeProcess(
        ["--model", lm_dir, "--served-model-name", LM_NAME, *local, *cli_sets(on_cpu("llm"))]
    ).start()
    try:
        async_omni = AsyncOmni(model=omni_dir, runtime={"backend": "local"}, **OMNI)
        omni.wait_ready()
        lm.wait_ready()
        yield omni, lm, async_omni
    finally:
        for server in (omni, lm):  # both stop at once
            if server.proc is not None and server.proc.poll() is None:
                server.proc.send_signal(signal.SIGTERM)
        if "async_omni" in locals():
            async_omni.shutdown()
        omni.stop()
        lm.stop()


def _connect(server, model=OMNI_NAME, key=KEY):
    client = openai.AsyncOpenAI(base_url=server.base_url + "/v1", api_key=key, max_retries=0)
    return client.realtime.connect(model=model)


def _engine_idle(server, timeout: float = IDLE_S) -> None:
    """Waits until no request runs and no KV block is held in any stage (blocks freed)."""
    deadline = time.monotonic() + timeout
    while True:
        values = {}
        for family in text_string_to_metric_families(httpx.get(server.base_url + "/metrics").text):
            for s in family.samples:
                values[s.name + str(sorted(s.labels.items()))] = s.value
        blocks = sum(v for k, v in values.items() if k.startswith("omni_stage_kv_blocks_in_use"))
        running = values["omni_requests_running[]"]
        if running == 0 and blocks == 0:
            return
        assert time.monotonic() < deadline, (running, blocks)
        time.sleep(0.05)


def test_typed_spoken_and_text_turns_equal_async_omni(servers):
    """Three turns on one connection: typed with audio out, spoken (committed by the client)
    with audio out, typed with text out. Turns 2 and 3 hit the prefix cache (the prompt is the
    whole conversation) and usage reports it."""
    omni, _, async_omni = servers

    async def go():
        async with _connect(omni) as conn:
            created = (await until(conn, "session.created"))[-1]["session"]
            assert created["output_modalities"] == ["audio"]
            assert created["audio"]["input"]["turn_detection"]["type"] == "server_vad"
            await conn.session.update(session={**NO_VAD, "max_output_tokens": 6})
            assert (await until(conn, "session.updated"))[-1]["session"]["max_output_tokens"] == 6
            messages = [user("Hello there")]
            await say(conn, "Hello there")
            first = turn(await until(conn, "response.done"))
            check(first, await reference_turn(async_omni, messages, 6, audio=True))
            messages.append({"role": "assistant", "content": first.text})

            voice = speech(1.0)
            await append(conn, voice)
            await conn.input_audio_buffer.commit()
            events = await until(conn, "conversation.item.done")
            committed = next(e for e in events if e["type"] == "input_audio_buffer.committed")
            assert events[-1]["item"]["id"] == committed["item_id"]
            assert events[-1]["item"]["content"][0]["type"] == "input_audio"
            await conn.response.create()
            second = turn(await until(conn, "response.done"))
            messages.append(user(voice))
            check(second, await reference_turn(async_omni, messages, 6, audio=True))
            messages.append({"role": "assistant", "content": second.text})

            await say(conn, "And now?", output_modalities=["text"])
            events = await until(conn, "response.done")
            assert not any("audio" in e["type"] for e in events)
            third = turn(events)
            messages.append(user("And now?"))
            check(third, await reference_turn(async_omni, messages, 6, audio=False))
            cached = [
                t.done["usage"]["input_token_details"]["cached_tokens"] for t in (second, third)
            ]
            assert 0 < cached[0] < cached[1] < third.done["usage"]["input_tokens"], cached

    asyncio.run(go())


def test_server_vad_commits_and_responds(servers):
    omni, _, async_omni = servers
    vad = {"type": "server_vad", "silence_duration_ms": 300, "prefix_padding_ms": 96}
    audio = np.concatenate([silence(0.6), speech(1.2), silence(0.7)])

    async def go():
        async with _connect(omni) as conn:
            await conn.session.update(
                session={
                    "type": "realtime",
                    "output_modalities": ["text"],
                    "max_output_tokens": 4,
                    "audio": {"input": {"turn_detection": vad}},
                }
            )
            await until(conn, "session.updated")
            await append(conn, audio)
            events = await until(conn, "response.done")
            kinds = [e["type"] for e in events]
            order = [
                "input_audio_buffer.speech_started",
                "input_audio_buffer.speech_stopped",
                "input_audio_buffer.committed",
                "conversation.item.added",
                "response.created",
                "response.done",
            ]
            assert [kinds.index(k) for k in order] == sorted(kinds.index(k) for k in order)
            started, stopped, committed = (events[kinds.index(k)] for k in order[:3])
            assert started["item_id"] == stopped["item_id"] == committed["item_id"]
            # speech from 600 to 1800 ms; windows of 32 ms; 96 ms of padding; 300 ms of silence
            assert 600 - 96 - 64 <= started["audio_start_ms"] <= 600 - 96 + 64, started
            assert 1800 + 300 <= stopped["audio_end_ms"] <= 1800 + 300 + 320, stopped
            spoken = audio[started["audio_start_ms"] * 24 : stopped["audio_end_ms"] * 24]
            got = turn(events)
            return got, await reference_turn(async_omni, [user(spoken)], 4, audio=False)

    got, ref = asyncio.run(go())
    check(got, ref)


def test_barge_in_cancels_the_response_and_the_next_is_correct(servers):
    """Speech detected during a response cancels it (turn_detected): its request is aborted in
    every stage (no request runs, no block is held), the reply stays as the text sent, and the
    next response (on the conversation with the spoken turn) is correct."""
    omni, _, async_omni = servers
    vad = {"type": "server_vad", "silence_duration_ms": 300, "create_response": False}
    interruption = np.concatenate([speech(0.6), silence(0.5)])

    async def go():
        async with _connect(omni) as conn:
            session = {"type": "realtime", "max_output_tokens": LONG}
            await conn.session.update(
                session={**session, "audio": {"input": {"turn_detection": vad}}}
            )
            await until(conn, "session.updated")
            await say(conn, "Tell me a long story")
            events = await until(conn, "response.output_audio_transcript.delta")
            await append(conn, interruption)
            events += await until(conn, "response.done")
            kinds = [e["type"] for e in events]
            assert kinds.index("input_audio_buffer.speech_started") < kinds.index("response.done")
            cut = turn(events)
            assert cut.done["status"] == "cancelled"
            assert cut.done["status_details"]["reason"] == "turn_detected"
            assert cut.done["output"][0]["content"][0]["transcript"] == cut.text
            events += await until(conn, "input_audio_buffer.committed")
            start = next(e for e in events if e["type"].endswith("speech_started"))
            stop = next(e for e in events if e["type"].endswith("speech_stopped"))
            await asyncio.to_thread(_engine_idle, omni)
            await conn.response.create(
                response={"output_modalities": ["text"], "max_output_tokens": 5}
            )
            after = turn(await until(conn, "response.done"))
            return cut, after, start, stop

    cut, after, start, stop = asyncio.run(go())
    # the interruption is the session's only audio: its positions are the session's
    heard = interruption[start["audio_start_ms"] * 24 : stop["audio_end_ms"] * 24]
    messages = [user("Tell me a long story"), {"role": "assistant", "content": cut.text}]
    ref = asyncio.run(reference_turn(async_omni, [*messages, user(heard)], 5, audio=False))
    check(after, ref)


def test_response_cancel_and_disconnect_free_the_engine(servers):
    omni, _, _ = servers

    async def go():
        async with _connect(omni) as conn:
            await conn.session.update(session={**NO_VAD, "max_output_tokens": LONG})
            await until(conn, "session.updated")
            await say(conn, "Count to a thousand", output_modalities=["text"])
            await until(conn, "response.output_text.delta")
            await conn.response.cancel()
            done = (await until(conn, "response.done"))[-1]["response"]
            assert done["status"] == "cancelled"
            assert done["status_details"]["reason"] == "client_cancelled"
            await asyncio.to_thread(_engine_idle, omni)
            await conn.response.cancel()
            error = (await until(conn, "error"))[-1]["error"]
            assert error["code"] == "response_cancel_not_active"
            # a spoken reply (the thinker's LONG tokens still running at its first audio), left
            # mid-way: the close aborts it in every stage
            await conn.response.create()
            await until(conn, "response.output_audio.delta")
        await asyncio.to_thread(_engine_idle, omni)

    asyncio.run(go())


def test_bad_events_are_errors_and_the_connection_stays_usable(servers):
    omni, _, _ = servers

    async def go():
        async with _connect(omni) as conn:
            await until(conn, "session.created")
            for name, bad, code, param in BAD_EVENTS:
                await conn.send_raw(json.dumps({**bad, "event_id": f"evt_{len(name)}"}))
                event = (await until(conn, "error"))[-1]
                error = event["error"]
                assert (error["code"], error["param"]) == (code, param), (name, error)
                if name != "oversized":  # not parsed: its id is unknown
                    assert error["event_id"] == f"evt_{len(name)}", (name, error)
            # nothing was changed by the refused events, and the connection still answers
            await conn.session.update(session={**NO_VAD, "max_output_tokens": 2})
            session = (await until(conn, "session.updated"))[-1]["session"]
            assert session["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 24000}
            assert session["audio"]["output"]["voice"] == "Chelsie"  # unset: the default's name
            await say(conn, "hi", output_modalities=["text"])
            done = (await until(conn, "response.done"))[-1]["response"]
            assert done["usage"]["output_tokens"] <= 2
            await conn.response.create(response={"max_output_tokens": LONG})
            await conn.response.create()  # while the first runs
            error = (await until(conn, "error"))[-1]["error"]
            assert error["code"] == "conversation_already_has_active_response"
            await conn.response.cancel()
            assert (await until(conn, "response.done"))[-1]["response"]["status"] == "cancelled"
            # cancelled at once, possibly while its prompt is still prepared: it still ends
            await conn.response.create(response={"max_output_tokens": LONG})
            await conn.response.cancel()
            assert (await until(conn, "response.done"))[-1]["response"]["status"] == "cancelled"

    asyncio.run(go())


def test_api_key_and_model_are_checked_at_the_upgrade(servers):
    omni, _, _ = servers

    async def connect(**kwargs):
        async with _connect(omni, **kwargs) as conn:
            await conn.recv()

    for kwargs, status in (({"key": "wrong"}, 401), ({"model": "gpt-realtime"}, 404)):
        with pytest.raises(Exception) as info:
            asyncio.run(connect(**kwargs))
        assert getattr(getattr(info.value, "response", None), "status_code", None) == status


def test_eight_concurrent_connections(servers):
    omni, _, async_omni = servers
    texts = [f"Question number {i}: what is {i} + {i}?" for i in range(8)]

    async def one(text):
        async with _connect(omni) as conn:
            await conn.session.update(session={**NO_VAD, "max_output_tokens": 5})
            await until(conn, "session.updated")
            await say(conn, text, output_modalities=["text"])
            return turn(await until(conn, "response.done"))

    async def go():
        got = await asyncio.gather(*(one(t) for t in texts))
        refs = await asyncio.gather(
            *(reference_turn(async_omni, [user(t)], 5, audio=False) for t in texts)
        )
        return got, refs

    got, refs = asyncio.run(go())
    assert len({r[0] for r in refs}) > 1  # different answers: a mix-up would show
    for g, r in zip(got, refs, strict=True):
        check(g, r)


def test_text_only_pipeline(servers):
    """A plain LM serves text turns, equal to its /v1/chat/completions answer, and refuses
    audio output and audio input with an error naming the field."""
    _, lm, _ = servers

    async def go():
        async with _connect(lm, model=LM_NAME, key="unused") as conn:
            session = (await until(conn, "session.created"))[-1]["session"]
            assert session["output_modalities"] == ["text"]
            await conn.session.update(session={"type": "realtime", "output_modalities": ["audio"]})
            error = (await until(conn, "error"))[-1]["error"]
            assert error["param"] == "session.output_modalities"
            assert "does not produce audio" in error["message"]
            await conn.input_audio_buffer.append(audio=b64(speech(0.2)))
            error = (await until(conn, "error"))[-1]["error"]
            assert (error["param"], error["code"]) == ("audio", "unsupported_value")
            await say(conn, "Hello there", output_modalities=["audio"])
            error = (await until(conn, "error"))[-1]["error"]
            assert error["param"] == "response.output_modalities"
            await conn.session.update(session={**NO_VAD, "max_output_tokens": 6})
            await until(conn, "session.updated")
            await conn.response.create()
            return turn(await until(conn, "response.done"))

    got = asyncio.run(go())
    client = openai.OpenAI(base_url=lm.base_url + "/v1", api_key="unused", max_retries=0)
    chat = client.chat.completions.create(
        model=LM_NAME, messages=[user("Hello there")], max_tokens=6
    )
    assert got.text == chat.choices[0].message.content
    assert got.done["usage"]["input_tokens"] == chat.usage.prompt_tokens


def test_items_are_retrieved_truncated_and_deleted(servers):
    """After an audio reply: retrieve gives the item as response.done did; truncate at what was
    played drops its transcript (past the audio sent: an error); delete takes it out of the next
    prompt, which is then the first one again (from the prefix cache)."""

    async def go():
        async with _connect(servers[0]) as conn:
            await until(conn, "session.created")
            await conn.session.update(session={**NO_VAD, "max_output_tokens": 6})
            await until(conn, "session.updated")
            await say(conn, "Hello there")
            first = turn(await until(conn, "response.done"))
            got, item_id = [], first.done["output"][0]["id"]
            for kind, fields in [("retrieve", {}), ("truncate", {"audio_end_ms": 10**6}),
                                 ("truncate", {"audio_end_ms": 100}), ("retrieve", {}),
                                 ("delete", {}), ("retrieve", {})]:  # fmt: skip
                extra = {"content_index": 0} if fields else {}
                await getattr(conn.conversation.item, kind)(item_id=item_id, **fields, **extra)
                got.append((await conn.recv()).model_dump())
            await conn.response.create()
            return first, got, turn(await until(conn, "response.done"))

    first, got, again = asyncio.run(go())
    assert first.audio.size > 2400 and first.text and got[0]["item"] == first.done["output"][0]
    assert (got[1]["type"], got[1]["error"]["param"]) == ("error", "audio_end_ms")
    assert got[2]["type"] == "conversation.item.truncated" and got[2]["audio_end_ms"] == 100
    assert got[3]["item"]["content"][0]["transcript"] == ""
    assert got[4]["type"] == "conversation.item.deleted"
    assert (got[5]["type"], got[5]["error"]["code"]) == ("error", "item_not_found")
    usage, before = again.done["usage"], first.done["usage"]
    assert usage["input_tokens"] == before["input_tokens"]
    assert usage["input_token_details"]["cached_tokens"] > 0
