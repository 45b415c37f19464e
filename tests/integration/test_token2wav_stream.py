"""Streaming (chunked) and batched token2wav on the tiny Qwen2.5-Omni checkpoint.

The chunk math is checked against the whole-sequence decode (`generate`, itself equal to
transformers): a window that covers everything must give the whole decode's samples, bounded
windows must stay within the bounds docs/streaming.md documents, and a request too long to
decode whole (its budget) is decoded in windows within the same bounds. The tiny checkpoint's random
DiT barely mixes frames (its mel is nearly the noise, a code moves other blocks by ~1e-7), so
the comparisons run on a copy whose DiT is amplified (`amplify_dit`): there a window start off
the block grid or a padding leak shows as errors of 1e-3 and more.

`python -m tests.integration.test_token2wav_stream [CHECKPOINT_DIR]` prints the bound table of
docs/streaming.md (default: the tiny checkpoint, as built and amplified).
"""

from __future__ import annotations

import contextlib
import math

import pytest
import torch

from omni.config import load_config
from omni.engine import GenerationEngine, generation_engine
from omni.messages import InputDelta, StageInput
from omni.runtime.stage_model import ChunkJob
from stages.qwen2_5_omni.token2wav import OmniToken2WavAdapter
from stages.qwen2_5_omni.token2wav_chunks import request_noise
from stages.qwen2_5_omni.token2wav_memory import whole_decode_bytes, window_codes
from stages.qwen2_5_omni.token2wav_vocoder import vocode
from tests.sync_counter import SyncCounter

pytestmark = pytest.mark.slow

SEED, NUM_CODES, HUGE = 3, 100, 10**6
# (first_chunk_size, chunk_size, left_context, look_ahead) -> (max abs diff, SNR dB) bounds on
# the amplified checkpoint, the measured values of docs/streaming.md with margin. None: the
# adapter's chunk_defaults().
BOUNDS = {
    (10, 45, HUGE, HUGE): (1e-4, 100.0),  # the window is the whole sequence: float rounding
    (10, 50, None, None): (1e-4, 100.0),
    (10, 25, 12, 12): (1e-2, 55.0),
    (10, 25, None, 0): (1.0, 14.0),  # no look-ahead
    (10, 25, 0, None): (1.0, 17.0),  # no left context
    (10, 25, 0, 0): (1.0, 12.0),
}


def amplify_dit(adapter: OmniToken2WavAdapter) -> OmniToken2WavAdapter:
    """Scale up the code embedding, the attention's values and output and the velocity head, so
    that the DiT's output depends on codes and on neighbouring blocks."""
    dit = adapter.dit
    with torch.no_grad():
        dit.text_embed.codec_embed.weight.mul_(10)
        dit.proj_out.weight.mul_(30)
        for layer in dit.transformer_blocks:
            layer.attn.to_v.weight.mul_(10)
            layer.attn.to_out[0].weight.mul_(10)
    return adapter


@pytest.fixture(scope="module")
def adapter(omni_dir) -> OmniToken2WavAdapter:
    return OmniToken2WavAdapter(omni_dir)


@pytest.fixture(scope="module")
def amplified(omni_dir) -> OmniToken2WavAdapter:
    return amplify_dit(OmniToken2WavAdapter(omni_dir))


def random_codes(num_codes: int, seed: int = 0) -> list[int]:
    return torch.randint(
        0, 8000, (num_codes,), generator=torch.Generator().manual_seed(seed)
    ).tolist()


def chunk_jobs(codes: list[int], first: int, size: int, left: int, ahead: int) -> list[ChunkJob]:
    """The jobs a stream of `codes` is decoded in, each with the codes there are when it gets
    ready (its own codes plus its look-ahead; all of them at the end)."""
    bounds = [0, *range(first, len(codes), size), len(codes)]
    jobs = []
    for start, end in zip(bounds, bounds[1:], strict=False):
        arrived = min(len(codes), end + ahead)
        complete = arrived == len(codes)
        jobs.append(ChunkJob(tuple(codes[:arrived]), start, end, left, ahead, complete, SEED))
    return jobs


def measure(adapter: OmniToken2WavAdapter, setting: tuple, codes: list[int], whole: torch.Tensor):
    """(max abs diff, SNR dB) of the joined chunks against the whole decode."""
    first, size, left, ahead = setting
    default_left, default_ahead = adapter.chunk_defaults()
    left = default_left if left is None else left
    ahead = default_ahead if ahead is None else ahead
    joined = torch.cat(adapter.decode_chunks(chunk_jobs(codes, first, size, left, ahead)))
    assert joined.shape == whole.shape  # num_codes * samples_per_code
    error = joined - whole
    snr = 10 * math.log10(whole.pow(2).sum().item() / max(error.pow(2).sum().item(), 1e-30))
    return error.abs().max().item(), snr


def whole_decode(adapter: OmniToken2WavAdapter, codes: list[int]) -> torch.Tensor:
    return adapter.generate(StageInput("whole", codes), SEED)


def test_noise_is_prefix_consistent():
    # request_noise relies on it: torch's CPU randn fills 16 values at a time from one stream.
    for num_frames in (1, 7, 24, 333):
        short = request_noise(SEED, num_frames, 80)
        assert torch.equal(short, request_noise(SEED, 1000, 80)[:num_frames])
        torch.manual_seed(SEED)  # what the whole decode draws
        assert torch.equal(short, torch.randn([1, num_frames, 80])[0])


def test_whole_decode_forks_the_rng_as_torch_2_11_takes_it(adapter, monkeypatch):
    """torch 2.11's fork_rng takes only a device type string (None raises there; 2.13 takes it):
    the whole decode names one, and leaves the process's generator as it was."""
    real = torch.random.fork_rng
    device_types = []

    def fork_rng_2_11(*args, device_type="cuda", **kwargs):
        device_types.append(device_type)
        if not isinstance(device_type, str):
            raise TypeError(f"torch 2.11: fork_rng(device_type={device_type!r})")
        return real(*args, device_type=device_type, **kwargs)

    monkeypatch.setattr(torch.random, "fork_rng", fork_rng_2_11)
    torch.manual_seed(11)
    before = torch.get_rng_state()
    codes = random_codes(12, seed=2)
    wav = whole_decode(adapter, codes)
    assert device_types and wav.shape == (12 * adapter.samples_per_code,)
    assert torch.equal(torch.get_rng_state(), before)
    assert torch.equal(wav, whole_decode(adapter, codes))  # seeded: the same noise again


@pytest.mark.parametrize("setting", list(BOUNDS), ids=str)
def test_chunks_match_whole_decode(amplified, setting):
    codes = random_codes(NUM_CODES)
    max_abs, snr = measure(amplified, setting, codes, whole_decode(amplified, codes))
    bound_abs, bound_snr = BOUNDS[setting]
    assert max_abs <= bound_abs and snr >= bound_snr, (setting, max_abs, snr)


def test_a_request_past_the_whole_decode_budget_is_decoded_in_windows(omni_dir, amplified):
    """generate() of a request whose whole decode would exceed the adapter's budget (the DiT's
    dense masks) decodes it in windows of the streaming path: the whole decode's length and,
    with the default context, its samples within the bounds of 50-code chunks."""
    dit = amplified.dit
    shape = {"repeats": dit.repeats, "num_heads": dit.num_attention_heads}
    budget = whole_decode_bytes(40, **shape)  # 40 codes whole at most: 100 go in 2 windows
    bounded = amplify_dit(OmniToken2WavAdapter(omni_dir, whole_decode_budget_bytes=budget))
    assert bounded.max_whole_codes == 40 and amplified.max_whole_codes > NUM_CODES
    codes = random_codes(NUM_CODES)
    whole = whole_decode(amplified, codes)
    decode_chunks, windows = bounded.decode_chunks, []
    bounded.decode_chunks = lambda jobs: windows.extend(jobs) or decode_chunks(jobs)
    windowed = whole_decode(bounded, codes)
    del bounded.decode_chunks
    size = window_codes(bounded.max_whole_codes, *bounded.chunk_defaults())
    assert [(j.start, j.end) for j in windows] == [
        (start, min(start + size, NUM_CODES)) for start in range(0, NUM_CODES, size)
    ]  # never all at once: 2 windows here
    assert windowed.shape == whole.shape == (NUM_CODES * amplified.samples_per_code,)
    error = windowed - whole
    snr = 10 * math.log10(whole.pow(2).sum().item() / max(error.pow(2).sum().item(), 1e-30))
    bound_abs, bound_snr = BOUNDS[(10, 50, None, None)]
    assert error.abs().max().item() <= bound_abs and snr >= bound_snr
    # Within the budget nothing changes: the whole decode, exactly.
    short = random_codes(30, seed=2)
    assert torch.equal(whole_decode(bounded, short), whole_decode(amplified, short))
    # The stage's GPU share (the engine's limit_transient_bytes) lowers the bound, never raises it.
    bounded.limit_transient_bytes(whole_decode_bytes(25, **shape))
    assert bounded.max_whole_codes == 25
    assert bounded.speed_stats()["max_whole_codes"] == 25
    bounded.limit_transient_bytes(1 << 40)
    assert bounded.max_whole_codes == 40


def test_batched_equals_single_jobs(amplified):
    codes = random_codes(60, seed=1)
    defaults = amplified.chunk_defaults()
    ethan, slow = {"speaker": "Ethan"}, {"guidance_scale": 0.0}
    jobs = [  # windows of different lengths, both speakers, CFG off, a real end and a cut
        ChunkJob(tuple(codes[:15]), 0, 10, 0, 5, False, SEED),
        ChunkJob(tuple(codes[:40]), 10, 30, 12, 10, False, SEED + 1, ethan),
        ChunkJob(tuple(codes), 40, 60, *defaults, True, SEED, slow),
        ChunkJob(tuple(codes), 57, 60, 3, 0, True, SEED, {"num_steps": 6}),  # its own ODE
    ]
    batched = amplified.decode_chunks(jobs)
    for job, chunk in zip(jobs, batched, strict=True):
        assert chunk.shape == ((job.end - job.start) * amplified.samples_per_code,)
        torch.testing.assert_close(chunk, amplified.decode_chunks([job])[0], atol=1e-4, rtol=0)


def test_vocoder_reach_and_batch(adapter):
    mel = torch.randn(80, 100, generator=torch.Generator().manual_seed(2)) - 5
    with torch.inference_mode():
        wav = adapter.bigvgan(mel[None])
        assert torch.equal(vocode(adapter.bigvgan, [mel])[0], wav)  # the model's ops, in order
        moved = mel.clone()
        moved[:, 50] += 3
        changed = (adapter.bigvgan(moved[None]) != wav).nonzero().flatten() / adapter.hop
    reach = adapter.vocoder_reach  # no sample further than reach frames from frame 50 moves
    assert changed.numel() and changed.min() >= 50 - reach and changed.max() < 51 + reach


def test_vocoder_batch_of_lengths_waits_for_no_device(adapter):
    """Mels of three lengths in one batch: each waveform is its unbatched one, and the padding
    masks cost no host-device sync (the lengths go to the device once, in one upload)."""
    gen = torch.Generator().manual_seed(4)
    mels = [torch.randn(80, n, generator=gen) - 5 for n in (30, 17, 24)]
    with torch.inference_mode(), SyncCounter({"vocode": vocode}) as counter:
        batched = vocode(adapter.bigvgan, mels)
    assert counter.of("vocode") == []
    with torch.inference_mode():
        for mel, wav in zip(mels, batched, strict=True):
            torch.testing.assert_close(wav, vocode(adapter.bigvgan, [mel])[0], atol=1e-5, rtol=0)


def engine(omni_dir, adapter, **stream) -> GenerationEngine:
    stage = {
        "name": "token2wav",
        "model": omni_dir,
        "kind": "generation",
        "adapter": "qwen2_5_omni_token2wav",
        "engine": {
            "seed": SEED,
            "max_num_seqs": stream.pop("max_num_seqs", 32),
            "max_num_batched_tokens": stream.pop("max_num_batched_tokens", 2048),
        },
        "stream": {"first_chunk_size": 4, "chunk_size": 8, "left_context": 8, "look_ahead": 4},
    }
    stage["stream"].update(stream)
    return GenerationEngine(load_config({"stages": [stage]}).stages[0], model=adapter)


def streaming(request_id: str, codes: list[int]) -> StageInput:
    return StageInput(request_id, codes, input_complete=False)


def test_engine_streams_chunks(omni_dir, adapter):
    stage = engine(omni_dir, adapter)
    codes = random_codes(30, seed=4)
    stage.add_request(streaming("s", codes[:3]))
    assert stage.has_unfinished and not stage.has_ready_work  # 4 codes + 4 look-ahead needed
    assert not stage.step().updates
    chunks = []
    for new, finished, num_chunks in ((codes[3:8], False, 1), (codes[8:20], False, 1)):
        stage.extend_request(InputDelta("s", new, finished=finished))
        assert stage.has_ready_work
        output = stage.step()
        assert len(output.updates) == num_chunks and not output.finished  # before the input ends
        chunks += [u.audio for u in output.updates]
        assert not stage.has_ready_work  # chunk [12, 20) waits for code 24
    with pytest.raises(ValueError, match="codec id"):
        stage.extend_request(InputDelta("s", [10**6]))  # refused, the request goes on
    stage.extend_request(InputDelta("s", codes[20:], finished=True))
    for _ in range(3):  # [12, 20), [20, 28) and the rest, [28, 30): a chunk per step
        output = stage.step()
        chunks += [u.audio for u in output.updates]
    assert [c.numel() for c in chunks] == [n * adapter.samples_per_code for n in (4, 8, 8, 8, 2)]
    (result,) = output.finished
    assert result.finish_reason == "stopped" and result.prompt_token_ids == codes
    assert torch.equal(result.audio, torch.cat(chunks)) and result.sample_rate == 24000
    assert "first_audio_s" in result.timings
    assert not stage.has_unfinished and stage.stats()["chunks"] == 5
    with pytest.raises(ValueError, match="not streaming"):
        stage.extend_request(InputDelta("s", codes))


def test_engine_first_chunk_goes_first(omni_dir, adapter, monkeypatch):
    """First chunks go ahead of later ones, and only their steps ask for the urgent stream."""
    urgent: list[bool] = []

    def recording(device, is_urgent):
        urgent.append(is_urgent)
        return contextlib.nullcontext()

    monkeypatch.setattr(generation_engine, "urgent_stream", recording)
    stage = engine(omni_dir, adapter, max_num_seqs=1)
    codes = random_codes(16, seed=5)
    stage.add_request(streaming("old", codes[:8]))
    assert stage.has_urgent_work  # its first chunk is ready
    assert [u.request_id for u in stage.step().updates] == ["old"]
    stage.extend_request(InputDelta("old", codes[8:]))  # old's chunk [4, 12) is ready
    assert stage.has_ready_work and not stage.has_urgent_work
    stage.add_request(streaming("new", codes[:8]))  # and new's first chunk
    assert stage.has_urgent_work
    assert [u.request_id for u in stage.step().updates] == ["new"]
    assert not stage.has_urgent_work
    assert [u.request_id for u in stage.step().updates] == ["old"]
    assert urgent == [True, True, False]
    (aborted,) = stage.abort(["old"])
    assert aborted.finish_reason == "aborted" and stage.num_requests == 1


def test_engine_step_code_budget(omni_dir, adapter):
    """A step decodes at most max_num_batched_tokens codes, windows counted with their context
    (first chunks: 4 codes + 4 ahead) and a batch of chunks as its size times its longest
    window; the first item always runs, and a whole request counts its codes."""
    stage = engine(omni_dir, adapter, max_num_batched_tokens=12)
    codes = random_codes(30, seed=6)
    for request_id in ("a", "b"):
        stage.add_request(streaming(request_id, codes[:8]))
    assert [u.request_id for u in stage.step().updates] == ["a"]  # 8 + 8 > 12
    assert [u.request_id for u in stage.step().updates] == ["b"]
    stage.add_request(StageInput("whole", codes))  # 30 codes, over the budget: alone
    stage.extend_request(InputDelta("a", codes[8:16]))  # a's [4, 12) needs [0, 16): 16 codes
    output = stage.step()
    assert [r.request_id for r in output.finished] == ["whole"] and not output.updates
    assert [u.request_id for u in stage.step().updates] == ["a"]
    big = engine(omni_dir, adapter, max_num_batched_tokens=24)
    for request_id in ("a", "b"):
        big.add_request(streaming(request_id, codes[:8]))
    assert [u.request_id for u in big.step().updates] == ["a", "b"]  # 8 + 8
    big.extend_request(InputDelta("a", codes[8:16]))
    big.add_request(streaming("c", codes[:8]))
    # c's first chunk (8 codes) padded to a's 16-code window: 2 x 16 > 24, although 8 + 16 fits.
    assert [u.request_id for u in big.step().updates] == ["c"]
    assert [u.request_id for u in big.step().updates] == ["a"]


def test_engine_zero_code_stream(omni_dir, adapter):
    stage = engine(omni_dir, adapter)
    stage.add_request(streaming("z", []))
    assert not stage.has_ready_work and not stage.step().finished
    stage.extend_request(InputDelta("z", finished=True))
    assert stage.has_ready_work
    (result,) = stage.step().finished
    assert result.audio.numel() == 0 and result.finish_reason == "stopped"
    with pytest.raises(ValueError, match="not streaming"):
        stage.extend_request(InputDelta("unknown", [1]))


if __name__ == "__main__":
    import sys

    from tools.make_tiny_checkpoint import ensure_checkpoint

    torch.set_num_threads(1)
    if len(sys.argv) > 1:  # a real checkpoint directory: measure it as it is
        models = [(sys.argv[1], lambda: OmniToken2WavAdapter(sys.argv[1]))]
    else:
        tiny = str(ensure_checkpoint("qwen2_5_omni", "tiny"))
        models = [
            ("tiny", lambda: OmniToken2WavAdapter(tiny)),
            ("tiny, DiT amplified", lambda: amplify_dit(OmniToken2WavAdapter(tiny))),
        ]
    codes = random_codes(NUM_CODES)
    for name, load in models:
        model = load()
        print(f"{name}: chunk_defaults() = {model.chunk_defaults()}")
        whole = whole_decode(model, codes)
        for setting in BOUNDS:
            max_abs, snr = measure(model, setting, codes, whole)
            print(f"  {setting}: max abs diff {max_abs:.2e}, SNR {snr:.1f} dB")
