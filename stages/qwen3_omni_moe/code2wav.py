"""Adapter `qwen3_omni_moe_code2wav`: Qwen3-Omni codec frames -> 24 kHz waveform.

Input: StageInput.extras["codes"], int64 [frames, num_code_groups] (input_processors.
talker_to_code2wav). The whole-sequence decode is transformers' own `chunked_decode(codes,
chunk_size=300, left_context_size=25)` on `codes.T` ([1, groups, frames]), the path `generate`
takes, so the waveform is transformers' (its window trims included).

`generate_batch` (the engine's batched hook, engine.batch_whole_requests) decodes several
requests as one [B, groups, T] batch, right-padded with code 0: code2wav is causal (causal
convolutions, causal sliding-window attention; a transposed convolution's output looks one frame
ahead, but the samples that see past a row's end are the ones it drops), so each row's samples up
to its own length are, in exact arithmetic, those of its decode alone; each is cut at
frames * samples_per_frame - (samples every window drops) * windows, the samples its decode alone
keeps. In float32 on the CPU a row differs from its decode alone in the last bits (measured up to
4e-6 on the tiny checkpoint, tests/integration/test_qwen3_omni_batch.py): PyTorch's CPU
convolution runs its native kernel for a batch of one under 20480 input elements and oneDNN
otherwise, and oneDNN's transposed convolution blocks the time axis by its length, so the batch
size and the padding both change the summation order (rows of equal length differ too: it is not
the padding's values). Hence batching is on by default only on CUDA.

Streaming (`decode_chunks`, a request whose codes still arrive): chunk [start, end) of frames is
decoded from the window [start - left_context, end) and keeps the window's LAST
(end - start) * samples_per_frame samples (a first chunk: all of them). One decode of W frames
returns W * samples_per_frame - trim samples (the causal transposed convolutions drop `trim` at
the right edge: 555 for the real model), so the samples a window keeps are exactly the absolute
samples [start * spf - trim, end * spf - trim) and a request's chunks join to
frames * spf - trim, the whole decode's length. Cutting `left_context * spf` off the window's
left instead loses `trim` samples at every boundary (a 23 ms gap at 24 kHz). A window needs at
least ceil(trim / spf) frames of left context to hold them; more left context brings its samples
closer to the whole decode's (the sliding-window attention and the convolutions see less of the
past at a window's start; docs/streaming.md measures the bound). The model is causal: look-ahead
codes add nothing, so windows end at the chunk. All jobs of a step are one [B, groups, W] batch,
right-padded (causality keeps each row's samples its own).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from transformers.utils import logging as hf_logging

from omni.messages import StageInput
from omni.runtime.stage_model import (
    BatchedGenerationModel,
    ChunkedGenerationModel,
    ChunkJob,
    StageModelBase,
)
from stages.meta_build import build_empty
from stages.qwen3_omni_moe.weights import load_part

SAMPLE_RATE = 24000
CHUNK_SIZE, LEFT_CONTEXT = 300, 25  # what generate passes to chunked_decode


class Qwen3OmniCode2WavAdapter(StageModelBase):
    sample_rate = SAMPLE_RATE

    def __init__(
        self,
        model_dir: str,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import (
            Qwen3OmniMoeCode2WavConfig,
        )
        from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
            Qwen3OmniMoeCode2Wav,
        )

        hf_logging.disable_progress_bar()
        self.device = torch.device(device)
        with open(os.path.join(model_dir, "config.json")) as f:
            raw = json.load(f)
        config = Qwen3OmniMoeCode2WavConfig(**raw["code2wav_config"])
        model = build_empty(lambda: Qwen3OmniMoeCode2Wav(config), dtype)  # as the talker's
        load_part(model, model_dir, "code2wav.", self.device)
        self.model = model.eval()
        self.num_code_groups = config.num_quantizers
        self.codebook_size = config.codebook_size
        self.samples_per_frame = int(self.model.total_upsample)
        self.trim = self._measure_trim()
        # Left context a chunk after the first needs: the frames whose samples fill its first
        # `trim` samples.
        self.min_left_context = -(-self.trim // self.samples_per_frame)

    @torch.inference_mode()
    def _measure_trim(self) -> int:
        """Samples a decode of W frames returns short of W * samples_per_frame, measured (the
        same for every W; checked on two)."""
        trims = set()
        for num_frames in (8, 9):
            codes = torch.zeros(1, self.num_code_groups, num_frames, dtype=torch.long)
            samples = self.model(codes.to(self.device)).shape[-1]
            trims.add(num_frames * self.samples_per_frame - samples)
        if len(trims) != 1:
            raise ValueError(f"code2wav output length is not frames * upsampling - trim: {trims}")
        return trims.pop()

    def chunk_defaults(self) -> tuple[int, int]:
        """(left_context, look_ahead): transformers' own chunked_decode context; causal, so none
        ahead."""
        return LEFT_CONTEXT, 0

    @torch.inference_mode()
    def decode_chunks(self, jobs: list[ChunkJob]) -> list[torch.Tensor]:
        """Each job's chunk, decoded as one batch: the window's last (end - start) * spf samples
        (a first chunk: all its end * spf - trim), so a request's chunks join to its whole
        decode's length, frames * spf - trim."""
        spf = self.samples_per_frame
        windows = []
        for job in jobs:
            codes = np.asarray(job.extras.get("codes", np.zeros((0, 0))), np.int64)
            if not 0 <= job.start < job.end <= len(codes):
                raise ValueError(f"chunk [{job.start}, {job.end}) outside {len(codes)} frames")
            first = max(job.start - max(job.left_context, self.min_left_context), 0)
            windows.append((codes[first : job.end], first))
        longest = max(len(window) for window, _ in windows)
        batch = torch.zeros(len(jobs), self.num_code_groups, longest, dtype=torch.long)
        for row, (window, _) in enumerate(windows):
            batch[row, :, : len(window)] = torch.from_numpy(window).T
        wav = self.model(batch.to(self.device))
        out = []
        for row, ((_, first), job) in enumerate(zip(windows, jobs, strict=True)):
            # The window's samples are the absolute samples from first * spf on (causal and
            # shift-equivariant); the chunk's are [start * spf - trim, end * spf - trim).
            low = max(job.start * spf - self.trim, 0) - first * spf
            high = max(job.end * spf - self.trim, 0) - first * spf
            out.append(wav[row, 0, low : max(high, low)].float().cpu())
        return out

    def check_inputs(self, stage_input: StageInput) -> None:
        codes = np.asarray(stage_input.extras.get("codes", np.zeros((0, self.num_code_groups))))
        if codes.ndim != 2 or codes.shape[1] != self.num_code_groups:
            raise ValueError(
                f"codes must be [frames, {self.num_code_groups}], got shape {list(codes.shape)}"
            )
        if codes.size and (codes.min() < 0 or codes.max() >= self.codebook_size):
            raise ValueError(f"codes must lie in [0, {self.codebook_size}), got {codes.max()}")
        if codes.size and codes.shape[0] != len(stage_input.prompt_token_ids):
            raise ValueError(
                f"{codes.shape[0]} code rows for {len(stage_input.prompt_token_ids)} frames "
                f"(prompt_token_ids: each frame's layer-0 code)"
            )

    def generate(self, stage_input: StageInput, seed: int) -> torch.Tensor:
        """The request's waveform (code2wav draws no noise: `seed` is unused)."""
        return self.decode_batch([stage_input.extras.get("codes")])[0]

    def generate_batch(
        self, stage_inputs: Sequence[StageInput], seeds: Sequence[int]
    ) -> list[torch.Tensor]:
        """The requests' waveforms, decoded as one batch (no noise: `seeds` are unused)."""
        return self.decode_batch([s.extras.get("codes") for s in stage_inputs])

    @torch.inference_mode()
    def decode_batch(self, codes: list[Any]) -> list[torch.Tensor]:
        """One 1-D float32 CPU waveform per [frames, groups] code array, decoded as one batch."""
        arrays = [np.asarray(c if c is not None else np.zeros((0, 0)), np.int64) for c in codes]
        lengths = [a.shape[0] if a.size else 0 for a in arrays]
        longest = max(lengths)
        if longest == 0:
            return [torch.zeros(0) for _ in arrays]
        batch = torch.zeros(len(arrays), self.num_code_groups, longest, dtype=torch.long)
        for row, (array, length) in enumerate(zip(arrays, lengths, strict=True)):
            if length:
                batch[row, :, :length] = torch.from_numpy(array).T
        wav = self.model.chunked_decode(
            batch.to(self.device), chunk_size=CHUNK_SIZE, left_context_size=LEFT_CONTEXT
        )
        num_windows = -(-longest // CHUNK_SIZE)
        lost = (longest * self.samples_per_frame - wav.shape[-1]) // num_windows
        out = []
        for row, length in enumerate(lengths):
            keep = max(length * self.samples_per_frame - lost * -(-length // CHUNK_SIZE), 0)
            out.append(wav[row, 0, :keep].float().cpu())
        return out


if TYPE_CHECKING:
    _CONTRACT: type[BatchedGenerationModel] = Qwen3OmniCode2WavAdapter
    _CHUNKED: type[ChunkedGenerationModel] = Qwen3OmniCode2WavAdapter
