"""Adapter `qwen2_5_omni_token2wav`: codec codes -> waveform (DiT to mel, then BigVGAN).

A generation-stage adapter (omni/engine/generation_engine.py): `generate(stage_input, seed)` runs one
request. It loads only the checkpoint's "token2wav." weights and spk_dict.pt, and keeps them in
float32 as transformers does (`self.token2wav.float()` in generate).

Noise and seeds: the only randomness is the DiT's initial state, drawn with torch.randn from
torch's global generator inside Qwen2_5OmniToken2WavDiTModel.sample. We call
torch.manual_seed(seed) right before each decode, inside torch.random.fork_rng() so that the
process's global RNG is left as it was. That equals transformers when the caller seeds right
before its token2wav call; in the full generate with greedy thinker and talker nothing draws from
the global RNG before token2wav, so torch.manual_seed(seed) before generate(...) matches too.
Each request is decoded on its own, as generate does, because the noise shape follows the
request's code length: batching would change the draws. A request longer than the whole-decode
budget allows (the DiT's masks grow with the square of its length: token2wav_memory.py) is
decoded in windows through the streaming path instead, on any device.

On a GPU the model runs there (float32 weights) and the DiT draws its noise from that GPU's
generator (seeded and forked the same way), as transformers does; waveforms come back as CPU
tensors. Streamed chunks run the DiT's matmuls in `stream.dtype` (float16 on a GPU by default,
set_chunk_dtype, with the Linear weights copied into it) and replay as CUDA graphs. Their noise
is drawn on the CPU (request_noise: only the CPU generator gives the same values for every
prefix of a request), so on a GPU streamed chunks use other noise than a whole-sequence decode
of the same seed: equally valid speech, not the same samples (docs/gpu.md).

Streaming: `decode_chunks` decodes chunks of requests whose codes are still arriving, several
in one batch, each from a bounded window of codes around it (stages/qwen2_5_omni/
token2wav_chunks.py has the math; `chunk_defaults` the context it needs). Its noise is the whole
decode's at the same frames, so chunks differ from `generate` only by the bounded context.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import Qwen2_5OmniToken2WavModel
from transformers.utils import logging as hf_logging

from omni.messages import StageInput
from omni.runtime.stage_model import ChunkedGenerationModel, ChunkJob, StageModelBase
from stages.qwen2_5_omni.part_loader import load_part, load_speakers, part_config
from stages.qwen2_5_omni.token2wav_chunks import (
    DitWindow,
    SpeakerInputs,
    Window,
    default_context,
    encode_speaker,
    plan_window,
    request_noise,
    solve_mels,
)
from stages.qwen2_5_omni.token2wav_dit import matmul_copy
from stages.qwen2_5_omni.token2wav_graphs import ChunkGraphs
from stages.qwen2_5_omni.token2wav_memory import (
    WHOLE_DECODE_BUDGET_BYTES,
    max_whole_decode_codes,
    window_codes,
)
from stages.qwen2_5_omni.token2wav_vocoder import hop_length, reach_frames, vocode

logger = logging.getLogger(__name__)

MAX_FLOAT32_RETRIES = 3  # overflowing batches before the chunks stay in float32
SAMPLE_RATE = 24000  # Qwen2.5-Omni's BigVGAN output rate (input_processors.py, docs: 24 kHz audio)
DEFAULT_SPEAKER = "Chelsie"
# Qwen2_5OmniToken2WavModel.forward defaults, overridable per request through extras.
ODE_DEFAULTS = {"num_steps": 10, "guidance_scale": 0.5, "sway_coefficient": -1.0}


class OmniToken2WavAdapter(StageModelBase):
    sample_rate = SAMPLE_RATE

    def __init__(
        self,
        model_dir: str,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        whole_decode_budget_bytes: int = WHOLE_DECODE_BUDGET_BYTES,
    ) -> None:
        """whole_decode_budget_bytes: requests whose whole decode would take more (the DiT's
        dense masks, token2wav_memory.py) are decoded in windows."""
        del dtype  # token2wav always runs in float32 (as transformers forces it)
        hf_logging.disable_progress_bar()
        self.device = torch.device(device)
        config = part_config(model_dir, "token2wav")
        config._attn_implementation = "sdpa"
        model = Qwen2_5OmniToken2WavModel(config).float()
        self.model = model.to(self.device).eval()
        load_part(self.model, model_dir, "token2wav.")  # copies each tensor onto the device
        dit = config.dit_config
        self.num_embeds = dit.num_embeds
        self.max_codes = dit.max_position_embeddings // dit.repeats
        self.speakers = {
            name: (v["cond"].float().to(self.device), v["ref_mel"].float().to(self.device))
            for name, v in load_speakers(model_dir).items()
        }
        self.dit = self.model.code2wav_dit_model
        self.bigvgan = self.model.code2wav_bigvgan_model
        self.repeats = dit.repeats  # mel frames per code
        self.hop = hop_length(self.bigvgan)  # waveform samples per mel frame
        self.samples_per_code = self.repeats * self.hop
        self.vocoder_reach = reach_frames(self.bigvgan)
        self._chunk_defaults = default_context(dit, self.vocoder_reach)
        self.whole_decode_budget_bytes = whole_decode_budget_bytes
        self.max_whole_codes = self._max_whole_codes(whole_decode_budget_bytes)
        self._encoded_speakers: dict[str, SpeakerInputs] = {}
        self.chunk_graphs: ChunkGraphs | None = None
        self.chunk_autocast: torch.dtype | None = None  # None: chunks in float32
        self.chunk_dit = self.dit  # the DiT chunks run: matmul weights in chunk_autocast
        self.num_float32_retries = 0

    def _max_whole_codes(self, budget: int) -> int:
        heads = self.dit.config.num_attention_heads
        return max_whole_decode_codes(repeats=self.repeats, num_heads=heads, budget_bytes=budget)

    def limit_transient_bytes(self, budget_bytes: int) -> None:
        """The engine's bound from the stage's GPU memory share (stage_memory.py): whole decodes
        stay within it as well as within whole_decode_budget_bytes."""
        bound = min(budget_bytes, self.whole_decode_budget_bytes)
        self.max_whole_codes = self._max_whole_codes(bound)
        logger.info(
            "token2wav: whole decodes up to %d codes (masks within %.2f GiB; the GPU share leaves "
            "%.2f), longer ones in windows", self.max_whole_codes, bound / 2**30, budget_bytes / 2**30
        )  # fmt: skip

    def set_chunk_dtype(self, dtype: torch.dtype) -> None:
        """The DiT's matmul precision in chunks (autocast, Linear weights in it: matmul_copy)."""
        if dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise ValueError(f"chunk dtype must be float32, float16 or bfloat16, got {dtype}")
        self.chunk_autocast = None if dtype == torch.float32 else dtype
        self.chunk_dit = self.dit if dtype == torch.float32 else matmul_copy(self.dit, dtype)

    def enable_cuda_graphs(self, max_chunks_per_step: int, required: bool = False) -> None:
        """Streamed chunks' DiT evaluations and BigVGAN replayed as CUDA graphs (frames padded to
        two attention blocks; eager on the CPU). required: a failed capture raises (else the
        chunks run eagerly)."""
        self.chunk_graphs = ChunkGraphs(
            frame_multiple=2 * self.dit.block_size,
            max_rows=max_chunks_per_step,
            required=required,
            bigvgan=self.bigvgan,
        )

    def speed_stats(self) -> dict[str, Any]:
        """How chunks are decoded (precision, float32 retries, CUDA graphs), and the longest
        request decoded whole."""
        precision = {
            "chunk_dtype": str(self.chunk_autocast or torch.float32).removeprefix("torch."),
            "float32_retries": self.num_float32_retries,
            "max_whole_codes": self.max_whole_codes,
        }
        graphs = self.chunk_graphs
        if graphs is None:
            return {**precision, "cuda_graphs": 0}
        return {
            **precision,
            "cuda_graphs": graphs.num_graphs + graphs.num_vocoder_graphs,
            "graph_captures": graphs.num_captures + graphs.num_vocoder_captures,
            "graph_replays": graphs.num_replays + graphs.num_vocoder_replays,
            "capture_s": graphs.capture_s,
            **({"graph_failure": graphs.failure} if graphs.failure else {}),
        }

    def check_inputs(self, stage_input: StageInput) -> None:
        codes = stage_input.prompt_token_ids
        if len(codes) > self.max_codes:
            raise ValueError(
                f"{len(codes)} codec tokens exceed the DiT's limit of {self.max_codes}"
            )
        bad = [c for c in codes if not 0 <= c < self.num_embeds]
        if bad:
            raise ValueError(f"codec id {bad[0]} is outside the DiT's {self.num_embeds} embeddings")
        self._check_extras(stage_input.extras)

    def _check_extras(self, extras: Mapping[str, Any]) -> None:
        speaker = extras.get("speaker", DEFAULT_SPEAKER)
        if speaker not in self.speakers:
            raise ValueError(f"unknown speaker {speaker!r}; available: {sorted(self.speakers)}")
        unknown = set(extras) - {"speaker", *ODE_DEFAULTS}
        if unknown:
            raise ValueError(f"unknown token2wav extras {sorted(unknown)}")

    @torch.inference_mode()
    def generate(self, stage_input: StageInput, seed: int) -> torch.Tensor:
        """The 1-D float32 waveform of one request's codes."""
        if not stage_input.prompt_token_ids:  # the talker stopped at once: nothing to say
            return torch.zeros(0)
        if len(stage_input.prompt_token_ids) > self.max_whole_codes:
            return self._decode_windowed(stage_input, seed)
        extras = stage_input.extras
        cond, ref_mel = self.speakers[extras.get("speaker", DEFAULT_SPEAKER)]
        ode = {k: extras.get(k, v) for k, v in ODE_DEFAULTS.items()}
        codes = torch.tensor([stage_input.prompt_token_ids], dtype=torch.long, device=self.device)
        # The noise is drawn on the model's device: fork (and restore) that device's generator
        # besides the CPU's (always forked). device_type is always a string: torch 2.11 refuses
        # None (2.13 takes it); on the CPU, devices=[] leaves CUDA untouched.
        on_gpu = self.device.type == "cuda"
        with torch.random.fork_rng(devices=[self.device] if on_gpu else [], device_type="cuda"):
            torch.manual_seed(seed)
            wav = self.model(codes, conditioning=cond, reference_mel=ref_mel, **ode)
        return wav.reshape(-1).float().cpu()

    def _decode_windowed(self, stage_input: StageInput, seed: int) -> torch.Tensor:
        """A request too long to decode whole within the budget: window after window of the
        streaming path, each emitting window_codes codes with the default context."""
        codes = tuple(stage_input.prompt_token_ids)
        left, ahead = self._chunk_defaults
        size = window_codes(self.max_whole_codes, left, ahead)
        chunks = [
            self.decode_chunks(
                [ChunkJob(codes, start, min(start + size, len(codes)), left, ahead, True, seed,
                          stage_input.extras)]
            )[0]
            for start in range(0, len(codes), size)
        ]  # fmt: skip
        return torch.cat(chunks)

    def chunk_defaults(self) -> tuple[int, int]:
        """(left_context, look_ahead) in codes: see token2wav_chunks.default_context."""
        return self._chunk_defaults

    @torch.inference_mode()
    def decode_chunks(self, jobs: list[ChunkJob]) -> list[torch.Tensor]:
        """Each job's chunk as a 1-D float32 waveform of (end - start) * samples_per_code
        samples. Jobs that share num_steps and sway_coefficient run one DiT forward per ODE
        evaluation together; BigVGAN runs once for all."""
        windows = [plan_window(job, self.repeats, self.dit.block_size) for job in jobs]
        groups: dict[tuple[int, float | None], list[int]] = {}  # ODE time schedule -> jobs
        for index, job in enumerate(jobs):
            self._check_extras(job.extras)
            ode = {k: job.extras.get(k, v) for k, v in ODE_DEFAULTS.items()}
            schedule = (int(ode["num_steps"]), ode["sway_coefficient"])
            groups.setdefault(schedule, []).append(index)
        mels: list[torch.Tensor] = [torch.empty(0)] * len(jobs)
        for (num_steps, sway_coefficient), indices in groups.items():
            inputs = [self._dit_window(jobs[i], windows[i]) for i in indices]
            solved = self._solve(inputs, num_steps, sway_coefficient)
            for index, mel in zip(indices, solved, strict=True):
                mels[index] = mel.T  # BigVGAN takes [mel_dim, frames]
        graphs = self.chunk_graphs
        wavs = graphs.vocode(mels) if graphs is not None else None
        chunks = []
        for wav, window in zip(wavs or vocode(self.bigvgan, mels), windows, strict=True):
            first = (window.emit_first_frame - window.first_frame) * self.hop
            num_samples = (window.emit_end_frame - window.emit_first_frame) * self.hop
            chunks.append(wav[first : first + num_samples])
        # Copied out of the batch's waveforms (a view would keep them all alive), in one piece:
        # on a GPU one device-to-host copy and one sync per step, not one per chunk.
        if len(chunks) < 2:
            return [chunk.to("cpu", copy=True) for chunk in chunks]
        return list(torch.cat(chunks).cpu().split([chunk.numel() for chunk in chunks]))

    def _solve(
        self, inputs: list[DitWindow], num_steps: int, sway_coefficient: float | None
    ) -> list[torch.Tensor]:
        autocast, graphs, dit = self.chunk_autocast, self.chunk_graphs, self.chunk_dit
        solved = solve_mels(dit, inputs, num_steps, sway_coefficient, graphs, autocast)
        # float16's range is small: a batch that overflowed is solved again in float32 (the
        # solve's one host sync).
        if autocast is not None and not bool(torch.isfinite(torch.cat(solved)).all()):
            self.num_float32_retries += 1
            logger.warning(
                "token2wav: a %s chunk batch was not finite; decoded in float32", autocast
            )
            solved = solve_mels(self.dit, inputs, num_steps, sway_coefficient, graphs, None)
            if self.num_float32_retries >= MAX_FLOAT32_RETRIES:  # these weights overflow it
                logger.warning("token2wav: chunks in float32 from now on (%s overflowed)", autocast)
                self.chunk_autocast, self.chunk_dit = None, self.dit
        return solved

    def _dit_window(self, job: ChunkJob, window: Window) -> DitWindow:
        first_code = window.first_frame // self.repeats
        codes = torch.tensor(job.token_ids[first_code : -(-window.end_frame // self.repeats)])
        skip = window.first_frame - first_code * self.repeats  # block_size % repeats may be odd
        num_frames = window.end_frame - window.first_frame
        frame_codes = codes.repeat_interleave(self.repeats)[skip : skip + num_frames]
        noise = request_noise(job.seed, window.end_frame, self.dit.mel_dim)  # on the host
        return DitWindow(
            frame_codes=frame_codes.to(self.device),
            first_frame=window.first_frame,
            noise=noise[window.first_frame :].to(self.device),
            speaker=self._speaker(job.extras.get("speaker", DEFAULT_SPEAKER)),
            guidance_scale=float(job.extras.get("guidance_scale", ODE_DEFAULTS["guidance_scale"])),
        )

    def _speaker(self, name: str) -> SpeakerInputs:
        """The speaker encoder's output is fixed per speaker: computed once, then reused."""
        if name not in self._encoded_speakers:
            cond, ref_mel = self.speakers[name]
            self._encoded_speakers[name] = encode_speaker(self.dit, cond, ref_mel)
        return self._encoded_speakers[name]


if TYPE_CHECKING:  # mypy checks the adapter against the contract its engine calls it by
    _CONTRACT: type[ChunkedGenerationModel] = OmniToken2WavAdapter
