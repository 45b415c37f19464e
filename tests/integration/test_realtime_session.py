"""Session features of /v1/realtime against real `omni serve` processes (the tiny Qwen2.5-Omni and
a tiny text LM with a 192-token context):
- input audio transcription (`session.audio.input.transcription`): a committed turn's transcript
  (its deltas, the completed event, the item's transcript) equals AsyncOmni's reply to that audio
  with the transcription instruction; a session that hears no audio, or a bad language, is
  refused;
- truncation "auto" (the default): a conversation past the context drops its oldest items and
  goes on, its later turns cached; "disabled": it is refused."""

from __future__ import annotations

import asyncio
import dataclasses

import openai
import pytest
from helpers import OMNI_ON_CPU, cli_sets, on_cpu
from realtime_support import NO_VAD, append, say, speech, until, user

from omni.entrypoints.async_omni import AsyncOmni
from omni.entrypoints.openai.prompts import chat_prompt
from omni.entrypoints.openai.realtime.input_transcription import MAX_TRANSCRIPT_TOKENS
from omni.entrypoints.openai.transcription import instruction
from tools.make_tiny_checkpoint import ensure_checkpoint
from tools.serve_process import ServeProcess

pytestmark = pytest.mark.slow
NAME, LM_NAME, CONTEXT = "tiny-omni", "tiny-lm", 192
TURNS = 12
TRANSCRIBE = {"type": "realtime", "audio": {"input": {"turn_detection": None, "transcription": {
    "model": "whisper-1", "language": "en"}}}}  # fmt: skip


@pytest.fixture(scope="module")
def omni_dir():
    return str(ensure_checkpoint("qwen2_5_omni", "tiny"))


@pytest.fixture(scope="module")
def servers(omni_dir):
    local = ["--set", "runtime.backend=local"]
    omni = ServeProcess(["--model", omni_dir, "--served-model-name", NAME, *local,
                         *cli_sets(OMNI_ON_CPU)]).start()  # fmt: skip
    lm_dir = str(ensure_checkpoint("qwen2", "tiny", 0))
    lm = ServeProcess(["--model", lm_dir, "--served-model-name", LM_NAME, *local,
                       *cli_sets(on_cpu("llm") | {"stages.llm.engine.max_model_len": CONTEXT}),
                       ]).start()  # fmt: skip
    try:
        omni.wait_ready()
        lm.wait_ready()
        yield omni, lm
    finally:
        omni.stop()
        lm.stop()


def _connect(server, model=NAME):
    client = openai.AsyncOpenAI(base_url=server.base_url + "/v1", api_key="-", max_retries=0)
    return client.realtime.connect(model=model)


def test_a_committed_turn_is_transcribed_as_the_python_api_would(servers, omni_dir):
    voice = speech(1.0)

    async def go():
        async with _connect(servers[0]) as conn:
            await until(conn, "session.created")
            await conn.session.update(session=TRANSCRIBE)
            session = (await until(conn, "session.updated"))[-1]["session"]
            await append(conn, voice)
            await conn.input_audio_buffer.commit()
            events = await until(conn, "conversation.item.input_audio_transcription.completed")
            item_id = events[-1]["item_id"]
            await conn.conversation.item.retrieve(item_id=item_id)
            retrieved = (await until(conn, "conversation.item.retrieved"))[-1]["item"]
            return session, events, retrieved

    session, events, retrieved = asyncio.run(go())
    assert session["audio"]["input"]["transcription"]["language"] == "en"
    async_omni = AsyncOmni(model=omni_dir, runtime={"backend": "local"}, **OMNI_ON_CPU)
    try:
        prompt = async_omni.prompt_processor
        messages = [user(voice, instruction(False, "en", None))]
        params = [dataclasses.replace(s.sampling, max_tokens=MAX_TRANSCRIPT_TOKENS, temperature=0.0)
                  if s.name == "thinker" else s.sampling for s in async_omni.config.stages]  # fmt: skip

        async def reference():
            outs = async_omni.generate(chat_prompt(prompt, messages), params, final_stage="thinker")
            return [out async for out in outs][-1].stages["thinker"]

        expected = asyncio.run(reference())
    finally:
        async_omni.shutdown()
    deltas = [e["delta"] for e in events if e["type"].endswith("transcription.delta")]
    completed = events[-1]
    assert "".join(deltas) == completed["transcript"] == expected.text != ""
    assert completed["usage"]["output_tokens"] == len(expected.token_ids)
    assert completed["usage"]["input_tokens"] == expected.num_prompt_tokens
    part = retrieved["content"][0]
    assert (part["type"], part["transcript"]) == ("input_audio", expected.text)


def test_transcription_is_refused_where_it_cannot_be_done(servers):
    async def go():
        params = []
        async with _connect(servers[1], LM_NAME) as conn:  # a text-only model
            await until(conn, "session.created")
            await conn.session.update(session=TRANSCRIBE)
            params.append((await until(conn, "error"))[-1]["error"]["param"])
        async with _connect(servers[0]) as conn:
            await until(conn, "session.created")
            bad = {**NO_VAD, "audio": {"input": {"transcription": {"language": "english"}}}}
            await conn.session.update(session=bad)
            params.append((await until(conn, "error"))[-1]["error"]["param"])
        return params

    assert asyncio.run(go()) == [
        "session.audio.input.transcription",
        "session.audio.input.transcription.language",
    ]


def test_a_conversation_past_the_context_drops_its_oldest_items(servers):
    async def turns(truncation: str) -> list[dict]:
        out = []
        async with _connect(servers[1], LM_NAME) as conn:
            await until(conn, "session.created")
            session = {**NO_VAD, "max_output_tokens": 8, "truncation": truncation}
            await conn.session.update(session=session)
            assert (await until(conn, "session.updated"))[-1]["session"]["truncation"] == truncation
            for i in range(TURNS):
                await say(conn, f"Turn {i}: tell me about rivers.")
                last = (await until(conn, "response.done", allow_errors=True))[-1]
                out.append(last["response"])
                if last["response"]["status"] == "failed" or out[-1]["output"] == []:
                    break
        return out

    async def refused() -> dict:
        async with _connect(servers[1], LM_NAME) as conn:
            await until(conn, "session.created")
            await conn.session.update(
                session={**NO_VAD, "max_output_tokens": 8, "truncation": "disabled"}
            )
            await until(conn, "session.updated")
            for i in range(TURNS):
                await say(conn, f"Turn {i}: tell me about rivers.")
                while (ev := (await asyncio.wait_for(conn.recv(), 60)).model_dump())["type"] not in (
                    "error", "response.done"):  # fmt: skip
                    pass
                if ev["type"] == "error":
                    return ev["error"]
        return {}

    responses = asyncio.run(turns("auto"))
    assert len(responses) == TURNS and all(
        r["status"] in ("completed", "incomplete") for r in responses
    )
    inputs = [r["usage"]["input_tokens"] for r in responses]
    assert max(inputs) + 8 <= CONTEXT and any(
        b < a for a, b in zip(inputs[:-1], inputs[1:], strict=True)
    ), inputs
    dropped = (
        next(i for i, (a, b) in enumerate(zip(inputs[:-1], inputs[1:], strict=True)) if b < a) + 1
    )
    # The turn after a truncation starts from the same items: its prompt is cached.
    cached = [r["usage"]["input_token_details"]["cached_tokens"] for r in responses]
    after = cached[dropped + 1]
    assert dropped + 1 < len(responses) and after > 0, (inputs, after)
    error = asyncio.run(refused())
    assert error.get("code") == "context_length_exceeded", error
