"""token2wav's streamed chunks with the DiT's matmuls in float16 or bfloat16 (`stream.dtype`,
torch.autocast; null is float16 on a GPU), on the CPU: the chunks stay within the bounds
docs/streaming.md states against float32 chunks, through the graphs' buffers too; a batch whose
float16 result overflows is decoded again in float32, equal to float32 chunks; the engine takes
the dtype from the config. The amplified DiT (test_token2wav_stream.py) makes rounding show."""

from __future__ import annotations

import collections
import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from omni.config import ConfigError
from omni.engine import GenerationEngine
from omni.engine.graph_plan import chunk_dtype
from stages.qwen2_5_omni.token2wav import OmniToken2WavAdapter
from stages.qwen2_5_omni.token2wav_chunks import _block_diff
from stages.qwen2_5_omni.token2wav_dit import dit_velocity, matmul_copy
from tests.integration.test_token2wav_graphs import jobs_of, stream, token2wav_stage
from tests.integration.test_token2wav_stream import amplify_dit, random_codes

pytestmark = pytest.mark.slow

# dtype -> (max abs difference, SNR dB) against float32 chunks: measured 4.3e-3 / 56 dB
# (float16) and 2.1e-2 / 40 dB (bfloat16) on the amplified tiny checkpoint, with margin.
BOUNDS = {torch.float16: (1e-2, 50.0), torch.bfloat16: (5e-2, 35.0)}


class OpCounter(TorchDispatchMode):
    """The aten ops a block dispatches, by name."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def adapter_in(omni_dir: str, dtype: torch.dtype, graphs: bool = False) -> OmniToken2WavAdapter:
    adapter = amplify_dit(OmniToken2WavAdapter(omni_dir))
    adapter.set_chunk_dtype(dtype)
    if graphs:
        adapter.enable_cuda_graphs(4)
    return adapter


def difference(got: list[torch.Tensor], want: list[torch.Tensor]) -> tuple[float, float]:
    """(max abs difference, SNR dB) of the joined chunks."""
    a, b = torch.cat(got), torch.cat(want)
    assert a.shape == b.shape
    noise = (a - b).pow(2).sum().item()
    return (a - b).abs().max().item(), 10 * math.log10(b.pow(2).sum().item() / max(noise, 1e-30))


@pytest.fixture(scope="module")
def float32_chunks(omni_dir):
    codes = random_codes(60, seed=1)
    return codes, adapter_in(omni_dir, torch.float32).decode_chunks(jobs_of(codes))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graph-buffers"])
def test_reduced_precision_chunks_stay_within_their_bound(omni_dir, float32_chunks, dtype, graphs):
    codes, want = float32_chunks
    adapter = adapter_in(omni_dir, dtype, graphs)
    max_abs, snr = difference(adapter.decode_chunks(jobs_of(codes)), want)
    bound_abs, bound_snr = BOUNDS[dtype]
    print(f"\n{dtype}: max abs {max_abs:.2e}, SNR {snr:.1f} dB against float32")
    assert 0 < max_abs <= bound_abs and snr >= bound_snr  # 0 < : the precision did change
    assert adapter.num_float32_retries == 0
    assert adapter.speed_stats()["chunk_dtype"] == str(dtype).removeprefix("torch.")


def test_a_float16_overflow_is_decoded_again_in_float32(omni_dir):
    """A DiT whose velocity exceeds float16's range (65504): every batch overflows and is solved
    again in float32, giving exactly the float32 chunks; after three, float32 for good."""
    huge = {}
    for dtype in (torch.float32, torch.float16):
        adapter = amplify_dit(OmniToken2WavAdapter(omni_dir))
        with torch.no_grad():  # before set_chunk_dtype, which copies the matmul weights
            adapter.dit.proj_out.weight.mul_(1e5)
        adapter.set_chunk_dtype(dtype)
        huge[dtype] = adapter
    codes = random_codes(60, seed=2)
    want = huge[torch.float32].decode_chunks(jobs_of(codes))
    got = huge[torch.float16].decode_chunks(jobs_of(codes))
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    assert huge[torch.float16].num_float32_retries == 2  # the two ODE schedules' batches
    assert huge[torch.float32].num_float32_retries == 0
    # A third overflow: these weights overflow float16, so the chunks stay in float32 after it.
    again = huge[torch.float16].decode_chunks(jobs_of(codes))
    assert all(torch.equal(a, b) for a, b in zip(again, want, strict=True))
    assert huge[torch.float16].num_float32_retries == 3
    assert huge[torch.float16].speed_stats()["chunk_dtype"] == "float32"


@pytest.mark.parametrize(("requested", "want"), [(None, torch.float32), ("float16", torch.float16)])
def test_the_engine_takes_the_dtype_from_the_config(omni_dir, requested, want):
    """null is float32 on the CPU (float16 on a GPU: tests/cuda); the audio streams either way."""
    config = token2wav_stage(omni_dir, False, dtype=requested)
    engine = GenerationEngine(config, model=amplify_dit(OmniToken2WavAdapter(omni_dir)))
    assert engine.chunk_dtype == want
    assert stream(engine, random_codes(30, seed=4)).numel() > 0
    assert engine.stats()["chunk_dtype"] == str(want).removeprefix("torch.")


def test_dtype_errors(omni_dir):
    with pytest.raises(ConfigError, match=r"stream\.dtype.*'float64'"):
        token2wav_stage(omni_dir, False, dtype="float64")
    with pytest.raises(ConfigError, match=r"stream\.left_context.*-1"):
        token2wav_stage(omni_dir, False, left_context=-1)
    fp16 = token2wav_stage(omni_dir, False, dtype="float16")
    with pytest.raises(ConfigError, match=r"stages\.token2wav\.stream\.dtype"):
        chunk_dtype(fp16, object(), torch.device("cpu"))  # an adapter without chunk precision
    assert chunk_dtype(token2wav_stage(omni_dir, False), object(), torch.device("cuda")) == (
        torch.float32
    )


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_the_matmul_copy_computes_what_autocast_does_with_fewer_casts(omni_dir, dtype):
    """matmul_copy's DiT (Linear weights stored in dtype) under autocast gives the float32 DiT's
    autocast velocity bit for bit, with two fewer casts per Linear layer (kernels on a GPU)."""
    adapter = amplify_dit(OmniToken2WavAdapter(omni_dir))
    dit, copy = adapter.dit, matmul_copy(adapter.dit, dtype)
    linears = [m for m in dit.modules() if isinstance(m, torch.nn.Linear)]
    assert all(m.weight.dtype == dtype for m in copy.modules() if isinstance(m, torch.nn.Linear))
    assert copy.time_embed is not dit.time_embed and linears[0].weight.dtype == torch.float32
    rows, frames = 2, 2 * dit.block_size
    state = torch.randn(rows, frames, dit.mel_dim, generator=torch.Generator().manual_seed(0))
    static = torch.randn(2 * rows, frames, dit.input_embed.proj.in_features - dit.mel_dim)
    cos, sin = dit.rotary_embed(state, torch.arange(frames).repeat(2 * rows, 1))
    inputs = (static, cos, sin, _block_diff([frames, frames - 5], frames, dit.block_size))
    inputs += (torch.full((rows, 1, 1), 0.7),)
    time = torch.tensor(0.25)
    casts = {}
    results = {}
    for name, module in (("float32", dit), ("copy", copy)):
        with torch.inference_mode(), OpCounter() as counter:
            results[name] = dit_velocity(module, time, state, *inputs, autocast=dtype)
        casts[name] = counter.ops["to"]  # under inference_mode: `to`, a copy when it casts
    assert torch.equal(results["copy"], results["float32"])
    num_biases = sum(m.bias is not None for m in linears)
    assert casts["float32"] - casts["copy"] == len(linears) + num_biases
