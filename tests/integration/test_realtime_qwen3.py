"""`/v1/realtime` with Qwen3-Omni: a real `omni serve` subprocess on the tiny Qwen3-Omni
checkpoint, driven by the official `openai` client's `client.realtime.connect`, unchanged.

A typed turn and a spoken turn (pcm16 at 24 kHz, resampled by the server to the audio encoder's
16 kHz), answered in audio (24 kHz, Qwen3-Omni's own rate) in a voice of the checkpoint named in
another case. The reference is AsyncOmni.generate in this process on the chat prompt of the same
conversation, as test_realtime.py builds it for Qwen2.5-Omni: text equal, audio within one int16
step; the second turn reports the first's prompt and reply as cached.
"""

from __future__ import annotations

import asyncio
import signal

import openai
import pytest
from helpers import cli_sets, on_cpu
from realtime_support import NO_VAD, append, check, reference_turn, say, speech, turn, until, user

from omni.entrypoints.async_omni import AsyncOmni
from tools.make_tiny_checkpoint import ensure_checkpoint
from tools.serve_process import ServeProcess

pytestmark = pytest.mark.slow

NAME, KEY = "tiny-qwen3-omni", "test-key"
MAX_TOKENS = 6
VOICE = "Chelsie"
"""Named as a user would: the checkpoint's speaker is "chelsie"."""
# On both sides: replies of exactly MAX_TOKENS, and 12 codec frames of speech.
OVERRIDES = {
    **on_cpu("thinker", "talker", "code2wav"),
    "stages.thinker.sampling.ignore_eos": True,
    "stages.talker.sampling.max_tokens": 12,
}


@pytest.fixture(scope="module")
def running(one_torch_thread):
    """The server and, loaded while it starts, the in-process reference."""
    model_dir = str(ensure_checkpoint("qwen3_omni_moe", "tiny"))
    server = ServeProcess(
        ["--model", model_dir, "--served-model-name", NAME, "--api-key", KEY]
        + ["--set", "runtime.backend=local", *cli_sets(OVERRIDES)]
    ).start()
    try:
        async_omni = AsyncOmni(model=model_dir, runtime={"backend": "local"}, **OVERRIDES)
        server.wait_ready()
        yield server, async_omni
    finally:
        if server.proc is not None and server.proc.poll() is None:
            server.proc.send_signal(signal.SIGTERM)  # it stops while the reference does
        if "async_omni" in locals():
            async_omni.shutdown()
        server.stop()


def test_typed_and_spoken_turns_equal_async_omni(running):
    server, async_omni = running
    client = openai.AsyncOpenAI(base_url=server.base_url + "/v1", api_key=KEY, max_retries=0)

    async def go():
        async with client.realtime.connect(model=NAME) as conn:
            created = (await until(conn, "session.created"))[-1]["session"]
            assert created["output_modalities"] == ["audio"]
            audio = {**NO_VAD["audio"], "output": {"voice": VOICE}}
            await conn.session.update(
                session={**NO_VAD, "audio": audio, "max_output_tokens": MAX_TOKENS}
            )
            session = (await until(conn, "session.updated"))[-1]["session"]
            assert session["audio"]["output"]["voice"] == VOICE.lower()

            messages = [user("Hello there")]
            await say(conn, "Hello there")
            first = turn(await until(conn, "response.done"))
            ref = await reference_turn(async_omni, messages, MAX_TOKENS, True, VOICE.lower())
            check(first, ref)
            messages.append({"role": "assistant", "content": first.text})

            voice = speech(1.0)
            await append(conn, voice)
            await conn.input_audio_buffer.commit()
            await until(conn, "conversation.item.done")
            await conn.response.create()
            second = turn(await until(conn, "response.done"))
            messages.append(user(voice))
            ref = await reference_turn(async_omni, messages, MAX_TOKENS, True, VOICE.lower())
            check(second, ref)
            usage = second.done["usage"]
            assert usage["input_token_details"]["audio_tokens"] > 0
            # the first turn's prompt and reply, at least one whole block
            assert 16 <= usage["input_token_details"]["cached_tokens"] < usage["input_tokens"]

    asyncio.run(go())
