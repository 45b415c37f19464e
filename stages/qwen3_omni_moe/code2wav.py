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
from omni.runtime.stage_model import BatchedGenerationModel, StageModelBase
from stages.qwen2_5_omni.part_loader import load_part

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
        model = Qwen3OmniMoeCode2Wav(config)
        self.model = model.to(device=self.device, dtype=dtype).eval()
        load_part(self.model, model_dir, "code2wav.")
        self.num_code_groups = config.num_quantizers
        self.codebook_size = config.codebook_size
        self.samples_per_frame = int(self.model.total_upsample)

    def check_inputs(self, stage_input: StageInput) -> None:
        codes = np.asarray(stage_input.extras.get("codes", np.zeros((0, self.num_code_groups))))
        if codes.ndim != 2 or codes.shape[1] != self.num_code_groups:
            raise ValueError(
                f"codes must be [frames, {self.num_code_groups}], got shape {list(codes.shape)}"
            )
        if codes.size and (codes.min() < 0 or codes.max() >= self.codebook_size):
            raise ValueError(f"codes must lie in [0, {self.codebook_size}), got {codes.max()}")

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
