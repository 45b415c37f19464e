"""Streaming speech through the synchronous API and the CLI (tiny Qwen2.5-Omni, local backend):
`Omni.stream` yields the audio as it is decoded (new samples only, joining to the finished
waveform), `Omni.generate` keeps the exact whole-sequence path unless asked, leaving a stream
early aborts it, and `omni run --stream-audio --output-wav` writes the WAV chunk by chunk.

The talker is given 96 codes (ignore_eos): with the vocoder's chunks of 10, then 50 codes, the
waveform comes in three pieces, the first while the talker is still generating.
"""

from __future__ import annotations

import time
import wave

import numpy as np
import pytest
import torch
from helpers import OMNI_ON_CPU, cli_sets

from omni import Omni
from omni.core.sampling_params import SamplingParams
from omni.entrypoints import run_command
from omni.entrypoints.cli import main
from omni.entrypoints.openai.audio_encoding import pcm16

pytestmark = pytest.mark.slow

PROMPT = "tell me about the sea"
TALKER_CODES = 96
# The same per-stage sampling as config overrides (the CLI's --set) and as SamplingParams.
SAMPLING = {
    "stages.thinker.sampling.max_tokens": 8,
    "stages.thinker.sampling.ignore_eos": True,
    "stages.talker.sampling.max_tokens": TALKER_CODES,
    "stages.talker.sampling.ignore_eos": True,
}
OVERRIDES = {**SAMPLING, **OMNI_ON_CPU}  # runs compared with each other: all on the CPU
PARAMS = [
    SamplingParams(max_tokens=8, ignore_eos=True),
    SamplingParams(max_tokens=TALKER_CODES, ignore_eos=True, stop_token_ids=(8292, 8294)),
    SamplingParams(max_tokens=1, seed=0),
]


@pytest.fixture(scope="module")
def omni(omni_dir):
    with Omni(model=omni_dir, runtime={"backend": "local"}, **OVERRIDES) as llm:
        yield llm


def _stream(llm: Omni, **kwargs) -> list:
    return list(llm.stream({"prompt": PROMPT}, PARAMS, **kwargs))


def test_stream_yields_new_audio_then_the_whole_waveform(omni):
    audio_stage = omni.async_omni.audio_stage
    results = _stream(omni, stream_audio=True)
    pieces = [r for r in results if not r.finished]
    finished = [r for r in results if r.finished]
    assert [r.stage for r in finished] == ["thinker", "talker", audio_stage]
    assert results[-1] is finished[-1]  # the final stage's finished result comes last
    assert len(pieces) > 1 and all(r.stage == audio_stage for r in pieces)
    assert all(r.finish_reason is None and r.audio.numel() > 0 for r in pieces)
    # Only the new samples each time: joined, exactly the finished result's waveform.
    whole = finished[-1].audio
    assert torch.equal(torch.cat([r.audio for r in pieces]), whole)
    # The first piece comes while the talker is still generating codes.
    talker_done = next(i for i, r in enumerate(results) if r.stage == "talker")
    assert results.index(pieces[0]) < talker_done
    timings = finished[-1].timings
    assert 0 < timings["first_audio_s"] < timings["finished_s"] and timings["rtf"] > 0
    # generate(stream_audio=True) runs the same streaming path: the same waveform.
    (streamed,) = omni.generate({"prompt": PROMPT}, PARAMS, use_tqdm=False, stream_audio=True)
    assert torch.equal(streamed.final.audio, whole)


def test_stream_without_audio_streaming_is_the_exact_path(omni):
    results = _stream(omni, stream_audio=False)
    assert all(r.finished for r in results)
    assert [r.stage for r in results] == ["thinker", "talker", omni.async_omni.audio_stage]
    (exact,) = omni.generate({"prompt": PROMPT}, PARAMS, use_tqdm=False)
    assert torch.equal(results[-1].audio, exact.final.audio)


def test_leaving_a_stream_at_the_first_audio_aborts_it(omni):
    for result in omni.stream({"prompt": PROMPT}, PARAMS, stream_audio=True):
        if not result.finished:
            break
    deadline = time.monotonic() + 10
    while omni.async_omni.num_requests:
        assert time.monotonic() < deadline, "the abandoned request is still running"
        time.sleep(0.05)


def test_run_stream_writes_the_wav_chunk_by_chunk(omni_dir, omni, tmp_path, capsys, monkeypatch):
    writes: list[int] = []
    write = run_command._WavStream.write

    def counting(self, audio, sample_rate):
        write(self, audio, sample_rate)
        with wave.open(self.path) as partial:  # a valid WAV after every chunk
            writes.append(partial.getnframes())

    monkeypatch.setattr(run_command._WavStream, "write", counting)
    path = tmp_path / "out" / "speech.wav"
    argv = ["run", "--model", omni_dir, "--prompt", PROMPT, "--raw", "--stream-audio"]
    argv += ["--output-wav", str(path), "--set", "runtime.backend=local"]
    assert main(argv + cli_sets(OVERRIDES)) == 0
    summary = capsys.readouterr().out.rstrip("\n").split("\n")[-1]

    with wave.open(str(path)) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (1, 2, 24000)
        samples = np.frombuffer(w.readframes(w.getnframes()), "<i2")
    # The CLI's stages default to the same sampling (token2wav's engine seed is 0).
    (reference,) = omni.generate({"prompt": PROMPT}, use_tqdm=False, stream_audio=True)
    assert np.array_equal(samples, pcm16(reference.final.audio))
    assert len(writes) > 1 and writes[-1] == len(samples) and writes == sorted(writes)
    assert f"in {len(writes)} chunks; first audio " in summary and "; RTF " in summary
    assert summary.endswith(f"wrote {path}")
