"""Chunked and batched token2wav: the math behind OmniToken2WavAdapter.decode_chunks.

A chunk of codes [start, end) is decoded from a window of codes [start - left, end + ahead)
(clamped to the codes there are) and only its own samples are kept, so a request's chunks join
to exactly num_codes * samples_per_code samples, the length of the whole-sequence decode.

What makes a window agree with the whole decode at the same frames:
- The DiT mixes frames only in its block-wise attention (frame f is in block f // block_size,
  a layer sees 0 or 1 blocks back and ahead); every other op is per frame. The window starts on
  a block boundary, so its blocks are the whole sequence's blocks; RoPE gets absolute positions.
- The initial ODE state is the whole decode's noise at the same frames (request_noise).
- The speaker encoder (ECAPA) sees only the reference mel: it is run once per speaker.
- BigVGAN is convolutional: output samples [f * hop, (f + 1) * hop) belong to mel frame f.
What still differs: each of the ODE's 4 * (num_steps - 1) DiT evaluations widens the receptive
field by the look-ahead/-back blocks, and BigVGAN's convolutions reach a few frames, so frames
near a window's cut see less context than in the whole decode. The bounded left_context and
look_ahead trade that error for latency (docs/streaming.md measures it).

Batching: jobs are padded to the longest window. In the DiT, padding frames sit outside every
real frame's attention (block_diff OUTSIDE) and attend only to each other. In BigVGAN every op
that mixes samples is fed, past each job's end, what the unbatched call would see there: zeros
before a convolution (its zero padding) and the last sample before a resampler (its replicate
padding). So each job's output equals its unbatched output up to float rounding.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
from transformers.models.qwen2_5_omni.configuration_qwen2_5_omni import Qwen2_5OmniDiTConfig

from omni.runtime.stage_model import ChunkJob
from stages.qwen2_5_omni.token2wav_dit import eager_velocity
from stages.qwen2_5_omni.token2wav_ode import integrate_rk4

GUIDANCE_OFF = 1e-5  # transformers' sample(): a guidance_scale below this runs without CFG
OUTSIDE = 1 << 20  # a block_diff beyond any look-ahead/-back: masks real <-> padding attention


@dataclass(frozen=True)
class Window:
    """The mel frames one job decodes, [first_frame, end_frame), and the frames it emits,
    [emit_first_frame, emit_end_frame); all absolute frames of the request."""

    first_frame: int
    end_frame: int
    emit_first_frame: int
    emit_end_frame: int


@dataclass(frozen=True)
class SpeakerInputs:
    """A speaker's DiT conditioning, the same at every ODE evaluation."""

    cond: torch.Tensor
    """[enc_emb_dim] the speaker's "cond" vector (the DiT forward's speaker_embedding)."""
    encoded: torch.Tensor
    """[2, enc_dim] the speaker encoder on (reference mel, zeros): the CFG's conditioned and
    null rows, computed on the same [2, T, mel] batch as in the whole decode."""


@dataclass(frozen=True)
class DitWindow:
    """One job's DiT input."""

    frame_codes: torch.Tensor
    """[num_frames] int64: the code each window frame shows (frame f shows code f // repeats)."""
    first_frame: int
    """The window's first absolute frame (a multiple of block_size)."""
    noise: torch.Tensor
    """[num_frames, mel_dim] the initial ODE state."""
    speaker: SpeakerInputs
    guidance_scale: float


def plan_window(job: ChunkJob, repeats: int, block_size: int) -> Window:
    num_codes = len(job.token_ids)
    if not 0 <= job.start < job.end <= num_codes:
        raise ValueError(f"chunk [{job.start}, {job.end}) is not inside the {num_codes} codes")
    first_code = max(0, job.start - job.left_context)
    end_code = min(num_codes, job.end + job.look_ahead)
    # Down to a block start: the window's attention blocks must be whole-sequence blocks.
    first_frame = first_code * repeats // block_size * block_size
    return Window(first_frame, end_code * repeats, job.start * repeats, job.end * repeats)


def request_noise(seed: int, num_frames: int, mel_dim: int) -> torch.Tensor:
    """[num_frames, mel_dim]: the initial ODE state of frames [0, num_frames) of a request.

    The whole decode draws randn([1, T, mel_dim]) right after torch.manual_seed(seed). Torch's
    CPU randn fills 16 values at a time from one stream, so a draw of n values with n a
    multiple of 16 is the prefix of any longer draw (tests check it): drawing a multiple of 16
    and cutting makes frame f's noise the same whatever the number of codes, and equal to the
    whole decode's (mel_dim 80: T * mel_dim is always a multiple of 16). fork_rng leaves the
    process's generator untouched."""
    num_values = num_frames * mel_dim
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        flat = torch.randn(-(-num_values // 16) * 16)
    return flat[:num_values].view(num_frames, mel_dim)


def encode_speaker(
    dit: torch.nn.Module, cond: torch.Tensor, ref_mel: torch.Tensor
) -> SpeakerInputs:
    encoded = dit.input_embed.spk_encoder(torch.cat([ref_mel, torch.zeros_like(ref_mel)]))
    return SpeakerInputs(cond=cond.reshape(-1), encoded=encoded)


class VelocityGraphsLike(Protocol):
    """What solve_mels needs of token2wav_graphs.ChunkGraphs (fixed shapes, replayed)."""

    def padded_shape(self, num_frames: int, num_jobs: int) -> tuple[int, int]: ...

    def velocity(
        self,
        dit: torch.nn.Module,
        inputs: tuple[torch.Tensor, ...],
        state: torch.Tensor,
        time_step: torch.Tensor,
        autocast: torch.dtype | None,
    ) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]: ...


def solve_mels(
    dit: torch.nn.Module,
    windows: list[DitWindow],
    num_steps: int,
    sway_coefficient: float | None,
    graphs: VelocityGraphsLike | None = None,
    autocast: torch.dtype | None = None,
) -> list[torch.Tensor]:
    """Each window's mel [num_frames, mel_dim]: one RK4 solve as in
    Qwen2_5OmniToken2WavDiTModel.sample, one DiT forward (all windows, CFG rows included) per
    evaluation (dit_velocity). With `graphs` the batch is padded to one of its shapes (more
    frames, and rows of no frames: both outside every real frame's attention) and each
    evaluation is a replay. `autocast` (e.g. float16) is the DiT's matmul precision, None
    float32; the ODE itself integrates in float32."""
    num_jobs = len(windows)
    device = windows[0].noise.device  # the DiT's: every window's tensors are there
    lengths = [w.frame_codes.numel() for w in windows]
    num_frames, num_rows = max(lengths), num_jobs
    if graphs is not None:
        num_frames, num_rows = graphs.padded_shape(num_frames, num_jobs)
    padding_rows = num_rows - num_jobs
    initial = torch.zeros(num_rows, num_frames, dit.mel_dim, device=device)
    codes = torch.zeros(num_rows, num_frames, dtype=torch.long, device=device)
    for row, (window, length) in enumerate(zip(windows, lengths, strict=True)):
        initial[row, :length] = window.noise
        codes[row, :length] = window.frame_codes
    padded = windows + windows[:1] * padding_rows  # a padding row's speaker is never heard
    static = torch.cat([_conditioning(dit, padded, codes, conditioned) for conditioned in (1, 0)])
    offsets = torch.tensor([w.first_frame for w in windows] + [0] * padding_rows, device=device)
    frames = torch.arange(num_frames, device=device)
    positions = (offsets[:, None] + frames).repeat(2, 1)  # CFG: rows twice
    cos, sin = dit.rotary_embed(initial, positions)
    block_diff = _block_diff(lengths + [0] * padding_rows, num_frames, dit.block_size, device)
    # transformers skips CFG below GUIDANCE_OFF: a zero scale keeps exactly the guided output.
    scale = [w.guidance_scale if w.guidance_scale >= GUIDANCE_OFF else 0.0 for w in windows]
    guidance = torch.tensor(scale + [0.0] * padding_rows, device=device).view(num_rows, 1, 1)
    inputs = (static, cos, sin, block_diff, guidance)

    times = torch.linspace(0, 1, num_steps, dtype=initial.dtype, device=device)
    if sway_coefficient is not None:
        times += sway_coefficient * (torch.cos(torch.pi / 2 * times) - 1 + times)
    velocity: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    if graphs is None:
        velocity = functools.partial(eager_velocity, dit, inputs, autocast)
    else:
        velocity = graphs.velocity(dit, inputs, initial, times[0], autocast)
    final = integrate_rk4(velocity, initial, times, num_steps, sway_coefficient)
    return [final[row, :length] for row, length in enumerate(lengths)]


def _conditioning(
    dit: torch.nn.Module, windows: list[DitWindow], codes: torch.Tensor, conditioned: int
) -> torch.Tensor:
    """The DiT input columns after the state, for the CFG's conditioned rows (1) or its null
    rows (0: codes dropped to 0, no speaker), in DiTInputEmbedding's order."""
    num_frames = codes.shape[1]
    row = 1 - conditioned  # SpeakerInputs.encoded: row 0 conditioned, row 1 null

    def along_time(vectors: list[torch.Tensor]) -> torch.Tensor:
        return torch.stack(vectors)[:, None, :].expand(-1, num_frames, -1)

    encoded = along_time([w.speaker.encoded[row] for w in windows])
    code_embed = dit.text_embed.codec_embed(codes if conditioned else torch.zeros_like(codes))
    speakers = [w.speaker.cond for w in windows]
    cond = along_time(speakers if conditioned else [torch.zeros_like(c) for c in speakers])
    return torch.cat((encoded, code_embed, cond), dim=-1)


def _block_diff(
    lengths: list[int], num_frames: int, block_size: int, device: torch.device | None = None
) -> torch.Tensor:
    """[2 * jobs, 1, T, T] key block - query block, as the DiT's _create_block_diff, with
    real <-> padding pairs OUTSIDE every layer's reach and padding <-> padding in one block
    (a padding row needs something to attend to, or SDPA returns NaN rows). Built on the host,
    then moved to `device`; dit_velocity expands it over the heads (free)."""
    blocks = torch.arange(num_frames) // block_size
    diff = (blocks[None, :] - blocks[:, None]).repeat(len(lengths), 1, 1)
    for row, length in enumerate(lengths):
        diff[row, :length, length:] = OUTSIDE
        diff[row, length:, :length] = OUTSIDE
        diff[row, length:, length:] = 0
    return torch.cat([diff, diff]).to(device)[:, None]


def default_context(dit_config: Qwen2_5OmniDiTConfig, vocoder_frames: int) -> tuple[int, int]:
    """(left_context, look_ahead) in codes that make ONE DiT forward and BigVGAN exact for the
    chunk's samples: its mel frames need vocoder_frames on each side (BigVGAN's reach), and
    each of those frames needs the blocks its attention reaches in one forward.
    - back: B = len(look_backward_layers) blocks; the window start is rounded down to a block
      start, so B * block_size frames before the chunk cover them wherever the chunk starts.
    - ahead: A = len(look_ahead_layers) blocks after the frame's own block, whose end can be
      block_size - 1 frames away: (A + 1) * block_size - 1 frames.
    Frames are codes * repeats. The ODE's repeated forwards reach further; the error left is
    what docs/streaming.md measures. Qwen2.5-Omni-7B (block_size 24, repeats 2, A = 1, B = 2,
    BigVGAN reach 37 frames) gets (43, 42) codes."""
    block_size, repeats = dit_config.block_size, dit_config.repeats
    back = len(dit_config.look_backward_layers) * block_size
    ahead = (len(dit_config.look_ahead_layers) + 1) * block_size - 1
    return (
        math.ceil((back + vocoder_frames) / repeats),
        math.ceil((ahead + vocoder_frames) / repeats),
    )
