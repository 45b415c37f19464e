"""Helpers of bench/gpu.py: random-weight checkpoints at real layouts, step timers, device info.

Checkpoints (built once into the checkpoint cache of tools/make_tiny_checkpoint.py, then reused):

* ``omni_checkpoint(layout)``: a Qwen2.5-Omni directory as our stage loaders and transformers
  read it (config.json, safetensors, generation_config.json, tokenizer, preprocessor config,
  spk_dict.pt). ``tiny`` is tools/tiny_omni.py's test layout; ``7b`` is Qwen2.5-Omni-7B's
  (thinker 28 x 3584 with its vision and audio towers, talker 24 x 896, DiT 22 x 1024, BigVGAN
  1536 channels: 10.7 B parameters, about 21 GiB in bf16 with token2wav in fp32), built on the
  given device with transformers' own random init. Its tokenizer is tools/tiny_tokenizer.py's
  2048-token BPE: the thinker's embedding keeps the 7B's 152064 rows (prompts are token ids).
  In both, the talker's codec-head rows of the codec EOS ids (8292, 8294) are zero, so that
  greedy decoding never picks them (their logit is 0, the others' maximum is far above) and
  every request produces exactly the codec budget on both sides.
* ``decoder_checkpoint(layout)``: a plain Qwen2 causal LM. ``tiny`` is tools/tiny_lm.py's
  (the cached tests checkpoint); ``0.5b`` has Qwen2.5-0.5B's layout (24 x 896, 14 heads / 2 KV
  heads, vocab 151936, tied embeddings: 494 M parameters).
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import platform
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, cast

import torch

from tools.make_tiny_checkpoint import cache_root, cached_build, ensure_checkpoint

CODEC_EOS = (8292, 8294)  # codec pad / codec end: where both sides' talkers stop
# Bump when the generated content changes: cached directories of an older version are rebuilt.
BUILD_VERSION = "1"
_VERSION_FILE = ".gpu_bench_version"
DECODER_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TOKENIZER_VOCAB = 2048  # BPE tokens of the 7b/0.5b tokenizers (the embeddings stay full size)
GIB = 1024**3

# Qwen2.5-Omni-7B's published config.json (values that differ from transformers' defaults are
# spelled out; the DiT and BigVGAN defaults are the 7B's).
OMNI_7B: dict[str, dict[str, Any]] = dict(
    text=dict(
        vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
        num_attention_heads=28, num_key_value_heads=4, max_position_embeddings=32768,
        rms_norm_eps=1e-6, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [16, 24, 24]},
    ),
    vision=dict(
        depth=32, hidden_size=1280, num_heads=16, intermediate_size=3420, out_hidden_size=3584,
        patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=112,
        fullatt_block_indexes=[7, 15, 23, 31],
    ),
    audio=dict(
        num_mel_bins=128, encoder_layers=32, encoder_attention_heads=20, encoder_ffn_dim=5120,
        d_model=1280, output_dim=3584, max_source_positions=1500, n_window=100,
    ),
    talker=dict(
        vocab_size=8448, embedding_size=3584, hidden_size=896, intermediate_size=18944,
        num_hidden_layers=24, num_attention_heads=12, num_key_value_heads=4, head_dim=128,
        max_position_embeddings=32768, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [16, 24, 24]},
    ),
    # num_embeds: the whole talker vocabulary (the real 8193 misses codes a random talker emits)
    dit=dict(
        hidden_size=1024, num_hidden_layers=22, num_attention_heads=16, head_dim=64, ff_mult=2,
        emb_dim=512, block_size=24, look_ahead_layers=[10], look_backward_layers=[0, 20],
        repeats=2, num_embeds=8448, mel_dim=80, dropout=0.1, enc_emb_dim=192, enc_dim=128,
        enc_channels=[256, 256, 256, 256, 768], enc_attention_channels=64, enc_se_channels=64,
        enc_res2net_scale=2, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    ),
    bigvgan=dict(
        mel_dim=80, upsample_initial_channel=1536, resblock_kernel_sizes=[3, 7, 11],
        resblock_dilation_sizes=[[1, 3, 5], [1, 3, 5], [1, 3, 5]],
        upsample_rates=[5, 3, 2, 2, 2, 2], upsample_kernel_sizes=[11, 7, 4, 4, 4, 4],
    ),
)  # fmt: skip
REF_MEL_LEN_7B = 300  # reference-mel frames of the random speakers

# Qwen2.5-0.5B's config.json (sliding window off, as it is in practice).
QWEN2_0_5B = dict(
    vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
    num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
    rms_norm_eps=1e-6, tie_word_embeddings=True, use_sliding_window=False,
)  # fmt: skip


# ---- checkpoints ---------------------------------------------------------------------------------
def _marker_ok(path: pathlib.Path) -> bool:
    marker = path / _VERSION_FILE
    return marker.is_file() and marker.read_text().strip() == BUILD_VERSION


def _cached(name: str, build: Callable[[pathlib.Path], None]) -> pathlib.Path:
    def build_and_mark(tmp: pathlib.Path) -> None:
        build(tmp)
        (tmp / _VERSION_FILE).write_text(BUILD_VERSION + "\n")

    return cached_build(cache_root() / name, _marker_ok, build_and_mark)


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """No progress bars, and no warnings about the composite config's token ids (true of the
    real checkpoint too: text ids lie outside the talker's codec vocabulary)."""
    from transformers.utils import logging as hf_logging

    bars, level = hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()


@contextlib.contextmanager
def _build_on(device: str, dtype: torch.dtype) -> Iterator[None]:
    """Modules created inside are allocated on `device` with `dtype` (transformers' init runs
    there: a 10 B model builds on a GPU in about a second)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            yield
    finally:
        torch.set_default_dtype(previous)


def omni_7b_config(ids: dict[str, int]) -> Any:
    """The Qwen2.5-Omni-7B layout with our tokenizer's special-token ids."""
    from transformers import Qwen2_5OmniConfig

    d = OMNI_7B
    mm = dict(
        image_token_index=ids["<|IMAGE|>"],
        video_token_index=ids["<|VIDEO|>"],
        audio_token_index=ids["<|AUDIO|>"],
        vision_start_token_id=ids["<|vision_bos|>"],
        vision_end_token_id=ids["<|vision_eos|>"],
        audio_start_token_id=ids["<|audio_bos|>"],
        audio_end_token_id=ids["<|audio_eos|>"],
    )
    text = dict(d["text"], eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"])
    thinker = dict(
        text_config=text,
        vision_config=d["vision"],
        audio_config=d["audio"],
        user_token_id=ids["<|im_start|>"],
        pad_token_id=ids["<|endoftext|>"],
        **mm,
    )
    from tools.tiny_omni import CODEC

    talker = dict(
        d["talker"],
        tts_text_start_token_id=ids["<|tts_bos|>"],
        tts_text_end_token_id=ids["<|tts_eos|>"],
        tts_text_pad_token_id=ids["<|tts_pad|>"],
        tts_codec_start_token_id=CODEC["start"],
        tts_codec_end_token_id=CODEC["end"],
        tts_codec_pad_token_id=CODEC["pad"],
        tts_codec_mask_token_id=CODEC["mask"],
        spatial_merge_size=2,
        **mm,
    )
    return Qwen2_5OmniConfig(
        thinker_config=thinker,
        talker_config=talker,
        token2wav_config=dict(dit_config=d["dit"], bigvgan_config=d["bigvgan"]),
    )


def build_omni(layout: str, out: pathlib.Path, device: str, seed: int = 0) -> int:
    """Write a Qwen2.5-Omni checkpoint of `layout` (tiny | 7b) into `out`; return #parameters."""
    from transformers import GenerationConfig, Qwen2_5OmniForConditionalGeneration

    from tools import tiny_omni, tiny_tokenizer
    from tools.tiny_lm import init_lm_weights

    size = cast(dict[str, int], tiny_omni.SIZES["tiny"])
    vocab = size["vocab"] if layout == "tiny" else TOKENIZER_VOCAB
    tok = tiny_tokenizer.save_qwen2_tokenizer(
        out, vocab, tiny_omni.SPECIALS, **tiny_omni.NAMED_TOKENS
    )
    ids = {t: tok.convert_tokens_to_ids(t) for t in tiny_omni.SPECIALS}
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)  # no-op without CUDA
    if layout == "tiny":
        config = tiny_omni.omni_config("tiny", ids)
        model = Qwen2_5OmniForConditionalGeneration(config).eval()
        names = [
            n
            for n, _ in model.named_parameters()
            if n.startswith(("thinker.model.", "thinker.lm_head", "talker."))
        ]
        init_lm_weights(model, seed, names)  # the tests checkpoint's decisive greedy choices
        enc, ref_mel_len = size["enc"], size["ref_mel_len"]
        build_device = "cpu"
    else:
        config = omni_7b_config(ids)
        # bf16 weights (token2wav: fp32, transformers casts it); transformers' init on `device`.
        dtype = torch.bfloat16
        with _build_on(device, dtype):
            model = Qwen2_5OmniForConditionalGeneration(config).eval()
        enc, ref_mel_len = int(OMNI_7B["dit"]["enc_emb_dim"]), REF_MEL_LEN_7B
        build_device = device
    # The vocoder's calibration (an audible waveform, not 1e-7) probes it with a CPU input.
    vocoder = model.token2wav.code2wav_bigvgan_model
    vocoder.to("cpu")
    tiny_omni._init_vocoder(vocoder, seed)
    vocoder.to(build_device)
    with torch.no_grad():
        model.talker.codec_head.weight[list(CODEC_EOS)] = 0.0
    model.save_pretrained(str(out))
    eos = [ids["<|im_end|>"], ids["<|endoftext|>"]]
    GenerationConfig(eos_token_id=eos, pad_token_id=ids["<|endoftext|>"]).save_pretrained(str(out))
    gen = torch.Generator().manual_seed(seed + 1)
    speakers = {
        name: {
            "bos_token": ids[f"<|spk_{name}|>"],
            "cond": torch.randn(1, enc, generator=gen),
            "ref_mel": torch.randn(1, ref_mel_len, 80, generator=gen),
        }
        for name in tiny_omni.SPEAKERS
    }
    torch.save(speakers, out / "spk_dict.pt")
    tiny_omni._save_processor_config(out)
    n = sum(p.numel() for p in model.parameters())
    del model
    return n


def omni_checkpoint(layout: str, device: str, seed: int = 0) -> pathlib.Path:
    """The cached Qwen2.5-Omni checkpoint of `layout`, built on `device` the first time."""
    if layout not in ("tiny", "7b"):
        raise ValueError(f"unknown Qwen2.5-Omni layout {layout!r}: tiny or 7b")

    def build(tmp: pathlib.Path) -> None:
        with _quiet_transformers():
            build_omni(layout, tmp, device, seed)

    return _cached(f"gpu-bench-qwen2_5_omni-{layout}-seed{seed}", build)


def build_decoder_0_5b(out: pathlib.Path, device: str, seed: int = 0) -> int:
    """Qwen2.5-0.5B's layout with transformers' random init, saved in bf16."""
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    from tools import tiny_tokenizer

    tok = tiny_tokenizer.save_qwen2_tokenizer(out, TOKENIZER_VOCAB, DECODER_SPECIALS)
    eos = tok.convert_tokens_to_ids("<|endoftext|>")
    config = Qwen2Config(
        **QWEN2_0_5B, rope_theta=1e6, bos_token_id=eos, eos_token_id=eos, pad_token_id=eos
    )
    config.dtype = "bfloat16"
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)
    with _build_on(device, torch.bfloat16):
        model = Qwen2ForCausalLM(config).eval()
    model.save_pretrained(str(out))
    GenerationConfig(bos_token_id=eos, eos_token_id=eos, pad_token_id=eos).save_pretrained(str(out))
    n = sum(p.numel() for p in model.parameters())
    del model
    return n


def decoder_checkpoint(layout: str, device: str, seed: int = 0) -> pathlib.Path:
    """tiny: tools/tiny_lm.py's cached Qwen2 checkpoint; 0.5b: Qwen2.5-0.5B's layout."""
    if layout == "tiny":
        return ensure_checkpoint("qwen2", "tiny", seed)
    if layout != "0.5b":
        raise ValueError(f"unknown decoder layout {layout!r}: tiny or 0.5b")

    def build(tmp: pathlib.Path) -> None:
        with _quiet_transformers():
            build_decoder_0_5b(tmp, device, seed)

    return _cached(f"gpu-bench-qwen2-0.5b-seed{seed}", build)


# ---- timing the live engine ----------------------------------------------------------------------
@dataclass
class StepRecord:
    """One StageEngine.step, split into its parts (seconds)."""

    batch: int  # requests scheduled
    tokens: int  # tokens fed
    decode: bool  # every scheduled request fed exactly one token
    schedule_s: float = 0.0
    execute_s: float = 0.0
    update_s: float = 0.0
    step_s: float = 0.0
    host_s: float = 0.0  # StageHost.run_once around the step (inbox, events): the whole turn
    schedule_cpu_s: float = 0.0  # thread CPU time of schedule
    update_cpu_s: float = 0.0  # thread CPU time of update


@dataclass
class StepTimer:
    """Wraps a live engine's `scheduler.schedule`, `runner.execute`, `update` and `step`, and
    its host's `run_once`, with timers (instance attributes shadow the methods, so the engine's
    own `self.scheduler.schedule()` / `self.update(...)` calls go through them).

    Wall time (perf_counter) for every part, plus the stepping thread's CPU time
    (time.thread_time) for schedule and update: they do no device work, so their CPU time is
    what the host spends on scheduling and bookkeeping per step."""

    records: list[StepRecord] = field(default_factory=list)
    _current: StepRecord | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _wrapped: list[tuple[Any, str]] = field(default_factory=list)

    def install(self, host: Any) -> None:
        engine = host.engine
        scheduler, runner = engine.scheduler, engine.runner
        schedule, execute = scheduler.schedule, runner.execute
        update, step, run_once = engine.update, engine.step, host.run_once

        def timed_schedule(*a: Any, **kw: Any) -> Any:
            w0, c0 = time.perf_counter(), time.thread_time()
            out = schedule(*a, **kw)
            w1, c1 = time.perf_counter(), time.thread_time()
            tokens = sum(len(e.token_ids) for e in out.scheduled)
            decode = bool(out.scheduled) and tokens == len(out.scheduled)
            record = StepRecord(len(out.scheduled), tokens, decode, w1 - w0)
            record.schedule_cpu_s = c1 - c0
            self._current = record
            return out

        def timed_execute(*a: Any, **kw: Any) -> Any:
            w0 = time.perf_counter()
            out = execute(*a, **kw)
            if self._current is not None:
                self._current.execute_s = time.perf_counter() - w0
            return out

        def timed_update(*a: Any, **kw: Any) -> Any:
            w0, c0 = time.perf_counter(), time.thread_time()
            out = update(*a, **kw)
            if self._current is not None:
                self._current.update_s = time.perf_counter() - w0
                self._current.update_cpu_s = time.thread_time() - c0
            return out

        def timed_step(*a: Any, **kw: Any) -> Any:
            self._current = None
            w0 = time.perf_counter()
            out = step(*a, **kw)
            if self._current is not None:
                self._current.step_s = time.perf_counter() - w0
            return out

        def timed_run_once(*a: Any, **kw: Any) -> Any:
            self._current = None
            w0 = time.perf_counter()
            out = run_once(*a, **kw)
            record, self._current = self._current, None
            if record is not None and record.step_s > 0:
                record.host_s = time.perf_counter() - w0
                with self._lock:
                    self.records.append(record)
            return out

        scheduler.schedule, runner.execute = timed_schedule, timed_execute
        engine.update, engine.step, host.run_once = timed_update, timed_step, timed_run_once
        self._wrapped = [
            (scheduler, "schedule"),
            (runner, "execute"),
            (engine, "update"),
            (engine, "step"),
            (host, "run_once"),
        ]

    def uninstall(self) -> None:
        """Drop the wrappers: the class's methods show through again."""
        for obj, name in self._wrapped:
            delattr(obj, name)
        self._wrapped.clear()

    def take(self) -> list[StepRecord]:
        with self._lock:
            records, self.records = self.records, []
        return records


# ---- device --------------------------------------------------------------------------------------
def cpu_name() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def device_line(device: str) -> str:
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        return (
            f"device: {torch.cuda.get_device_name(0)} ({props.total_memory / GIB:.1f} GiB, "
            f"compute capability {props.major}.{props.minor}, {props.multi_processor_count} SMs), "
            f"torch {torch.__version__}, CUDA {torch.version.cuda}; host CPU {cpu_name()} "
            f"({os.cpu_count()} cores)"
        )
    return (
        f"device: CPU, {cpu_name()} ({os.cpu_count()} cores, torch threads "
        f"{torch.get_num_threads()}), torch {torch.__version__}"
    )


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def reset_peak(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()


def peak_gib(device: str) -> float | None:
    """torch.cuda.max_memory_allocated since the last reset_peak, in GiB (None on the CPU)."""
    if device != "cuda":
        return None
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() / GIB


def allocated_gib(device: str) -> float | None:
    if device != "cuda":
        return None
    return torch.cuda.memory_allocated() / GIB


def release(device: str) -> None:
    """Return freed blocks to the driver after a model is dropped."""
    import gc

    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def gib(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"
