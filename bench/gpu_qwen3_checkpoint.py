"""Random-weight Qwen3-Omni checkpoints for bench/gpu.py --family qwen3_omni_moe, built once and
cached (the checkpoint cache of tools/make_tiny_checkpoint.py).

* ``tiny``: tools/tiny_qwen3_omni.py's "bench" layout (the cached `qwen3_omni_moe-bench` of
  tools/make_tiny_checkpoint.py): the real model's 16 code groups and 1920 samples per frame at
  small widths; its codec-head row of codec EOS is zero.
* ``30b``: Qwen3-Omni-30B-A3B-Instruct's published config.json (QWEN3_OMNI_30B below: thinker 48
  layers x 2048, 32 heads / 4 KV heads of 128, 128 experts of 768 top-8, vocab 152064; vision
  tower 27 x 1152; audio tower 32 x 1280; talker 20 layers x 1024, 16 heads / 2 KV heads of 128,
  128 experts of 384 top-6 plus a 768-wide shared expert, codec vocab 3072; code predictor 5 x
  1024, 16 code groups; code2wav 8 x 1024, decoder 1536, upsampling 8*5*4*3*2*2 = 1920 samples
  per frame; speakers chelsie / ethan / aiden at codec ids 2301..2303), every weight bf16, built
  on the given device with transformers' own random init (written to disk with a progress bar).
  About 35 B parameters, 70 GB (65 GiB) at 48 layers: more than the lent GPU machines' 64 GiB of
  disk, so `layers` (the thinker's decoder layers) and `talker_layers` cut the stacks; each
  thinker layer is 623 M parameters (1.25 GB), each talker layer 158 M. With fewer than 48
  thinker layers `accept_hidden_layer` is scaled with them (layers // 2; 24 at 48).

Assumptions where the published config does not settle a value for transformers 5.23: the
talker's `num_experts` is the published `num_local_experts` (128); the four fields transformers
reads but does not declare are set as tools/tiny_qwen3_omni.py sets them (the published
`vision_start_token_id`, `spatial_merge_size` 2, `shared_expert_intermediate_size` 768, the
published speaker ids). The tokenizer is tools/tiny_tokenizer.py's 2048-token BPE (prompts are
token ids) with the special-token ids our tokenizer gives; the thinker's embedding keeps its
152064 rows. code2wav's convolutions are re-drawn as tools/tiny_qwen3_omni.py does (an audible
waveform), and the codec-head row of codec EOS is zero: greedy decoding never picks it (its logit
is 0, the best code's far above), so both sides make exactly the frame budget.
"""

from __future__ import annotations

import pathlib
import sys
import threading
import time
from typing import Any

import torch
from gpu_checkpoints import TOKENIZER_VOCAB, _build_on, _cached, _quiet_transformers

from tools.make_tiny_checkpoint import ensure_checkpoint

LAYERS, TALKER_LAYERS = 48, 20  # the real stacks
_ROPE = {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [24, 20, 20], "interleaved": True}  # fmt: skip
# Qwen3-Omni-30B-A3B-Instruct's config.json (values that differ from transformers' defaults, and
# the ones that decide the layout, spelled out).
QWEN3_OMNI_30B: dict[str, dict[str, Any]] = dict(
    text=dict(
        vocab_size=152064, hidden_size=2048, intermediate_size=768, num_hidden_layers=LAYERS,
        num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_experts=128,
        num_experts_per_tok=8, moe_intermediate_size=768, norm_topk_prob=True,
        decoder_sparse_step=1, mlp_only_layers=[], max_position_embeddings=65536,
        rms_norm_eps=1e-6, tie_word_embeddings=False, rope_parameters=_ROPE,
    ),
    vision=dict(
        depth=27, hidden_size=1152, num_heads=16, intermediate_size=4304, out_hidden_size=2048,
        patch_size=16, spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=2304,
        deepstack_visual_indexes=[8, 16, 24], hidden_act="gelu_pytorch_tanh",
    ),
    audio=dict(
        num_mel_bins=128, encoder_layers=32, encoder_attention_heads=20, encoder_ffn_dim=5120,
        d_model=1280, output_dim=2048, downsample_hidden_size=480, max_source_positions=1500,
        n_window=50, n_window_infer=800, conv_chunksize=500,
    ),
    talker_text=dict(
        vocab_size=3072, hidden_size=1024, intermediate_size=2048, num_hidden_layers=TALKER_LAYERS,
        num_attention_heads=16, num_key_value_heads=2, head_dim=128, num_experts=128,
        num_experts_per_tok=6, moe_intermediate_size=384, shared_expert_intermediate_size=768,
        norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
        max_position_embeddings=65536, rms_norm_eps=1e-6, rope_parameters=_ROPE,
    ),
    predictor=dict(
        vocab_size=2048, hidden_size=1024, intermediate_size=3072, num_hidden_layers=5,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128, num_code_groups=16,
        max_position_embeddings=32768, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6},
    ),
    talker=dict(
        num_code_groups=16, thinker_hidden_size=2048, accept_hidden_layer=24,
        codec_pad_id=2148, codec_bos_id=2149, codec_eos_token_id=2150, codec_nothink_id=2155,
        codec_think_bos_id=2156, codec_think_eos_id=2157, spatial_merge_size=2,
        speaker_id={"chelsie": 2301, "ethan": 2302, "aiden": 2303},
    ),
    code2wav=dict(
        codebook_size=2048, hidden_size=1024, num_hidden_layers=8, num_attention_heads=16,
        num_key_value_heads=16, intermediate_size=3072, sliding_window=72, num_quantizers=16,
        upsample_rates=[8, 5, 4, 3], upsampling_ratios=[2, 2], decoder_dim=1536,
        max_position_embeddings=8000, layer_scale_initial_scale=0.01, rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    ),
)  # fmt: skip


def qwen3_30b_config(
    ids: dict[str, int], layers: int = LAYERS, talker_layers: int = TALKER_LAYERS
) -> Any:
    """The Qwen3-Omni-30B-A3B layout with `layers` thinker and `talker_layers` talker layers and
    our tokenizer's special-token ids (`ids`: token string -> id)."""
    from transformers import Qwen3OmniMoeConfig

    if not 1 <= layers <= LAYERS:
        raise ValueError(f"layers must be in 1..{LAYERS}, got {layers!r}")
    if not 1 <= talker_layers <= TALKER_LAYERS:
        raise ValueError(f"talker_layers must be in 1..{TALKER_LAYERS}, got {talker_layers!r}")
    d = QWEN3_OMNI_30B
    mm = dict(
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        audio_token_id=ids["<|audio_pad|>"], audio_start_token_id=ids["<|audio_start|>"],
        vision_start_token_id=ids["<|vision_start|>"], position_id_per_seconds=13,
    )  # fmt: skip
    thinker = dict(
        text_config=dict(d["text"], num_hidden_layers=layers), vision_config=d["vision"],
        audio_config=d["audio"], user_token_id=ids["user"], **mm,
    )  # fmt: skip
    talker = dict(
        d["talker"], text_config=dict(d["talker_text"], num_hidden_layers=talker_layers),
        code_predictor_config=d["predictor"], accept_hidden_layer=24 * layers // LAYERS, **mm,
    )  # fmt: skip
    return Qwen3OmniMoeConfig(
        thinker_config=thinker, talker_config=talker, code2wav_config=d["code2wav"],
        im_start_token_id=ids["<|im_start|>"], im_end_token_id=ids["<|im_end|>"],
        tts_pad_token_id=ids["<|tts_pad|>"], tts_bos_token_id=ids["<|tts_bos|>"],
        tts_eos_token_id=ids["<|tts_eos|>"], system_token_id=ids["system"],
        user_token_id=ids["user"], assistant_token_id=ids["assistant"],
    )  # fmt: skip


def build_qwen3_30b(
    out: pathlib.Path, device: str, seed: int = 0, layers: int = LAYERS,
    talker_layers: int = TALKER_LAYERS,
) -> int:  # fmt: skip
    """Write the 30B-layout checkpoint (bf16, built on `device`) into `out`; return #parameters."""
    from transformers import GenerationConfig, Qwen3OmniMoeForConditionalGeneration

    from tools import tiny_qwen3_omni, tiny_tokenizer

    tok = tiny_tokenizer.save_qwen2_tokenizer(
        out, TOKENIZER_VOCAB, tiny_qwen3_omni.SPECIALS, **tiny_qwen3_omni.NAMED_TOKENS
    )
    ids = {t: tok.convert_tokens_to_ids(t) for t in tiny_qwen3_omni.SPECIALS}
    config = qwen3_30b_config(ids, layers, talker_layers)
    config.dtype = "bfloat16"
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)  # no-op without CUDA
    t0 = time.perf_counter()
    print(f"  building {layers}/{talker_layers}-layer model on {device} in bf16 ...", flush=True)
    with _build_on(device, torch.bfloat16):
        model = Qwen3OmniMoeForConditionalGeneration(config).eval()
    n = sum(p.numel() for p in model.parameters())
    print(f"  built {n / 1e9:.2f} B parameters in {time.perf_counter() - t0:.1f} s", flush=True)
    # The calibration of code2wav (an audible waveform) probes it with a CPU float32 input.
    model.code2wav.to("cpu", torch.float32)
    tiny_qwen3_omni.init_code2wav(model.code2wav, seed)
    model.code2wav.to(device, torch.bfloat16)
    with torch.no_grad():
        model.talker.codec_head.weight[config.talker_config.codec_eos_token_id] = 0.0
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    with DiskProgress(out, nbytes):  # shards of the real checkpoint's size: the bar moves
        model.save_pretrained(str(out), max_shard_size="4GB")
    eos = [ids["<|im_end|>"], ids["<|endoftext|>"]]
    GenerationConfig(eos_token_id=eos, pad_token_id=ids["<|endoftext|>"]).save_pretrained(str(out))
    tiny_qwen3_omni._save_processor_config(out)
    del model
    return n


class DiskProgress:
    """A progress bar of the bytes written under `path` (polled from a thread while the body
    writes: save_pretrained has no progress of its own)."""

    def __init__(self, path: pathlib.Path, total: int) -> None:
        self.path, self.total = path, total
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)

    def _written(self) -> int:
        return sum(f.stat().st_size for f in self.path.glob("*.safetensors*") if f.is_file())

    def _poll(self) -> None:
        from tqdm import tqdm

        every = 1.0 if sys.stderr.isatty() else 10.0  # a log gets a line per 10 s
        bar = tqdm(total=self.total, unit="B", unit_scale=True, desc="  writing", mininterval=every)
        with bar:
            while not self.done.wait(every):
                bar.update(max(0, min(self.total, self._written()) - bar.n))
            bar.update(max(0, min(self.total, self._written()) - bar.n))

    def __enter__(self) -> None:
        self.thread.start()

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join()


def qwen3_checkpoint(
    layout: str, device: str, seed: int = 0, layers: int = LAYERS,
    talker_layers: int = TALKER_LAYERS,
) -> pathlib.Path:  # fmt: skip
    """The cached Qwen3-Omni checkpoint of `layout` (tiny | 30b), built the first time."""
    if layout == "tiny":
        return ensure_checkpoint("qwen3_omni_moe", "bench", seed)
    if layout != "30b":
        raise ValueError(f"unknown Qwen3-Omni layout {layout!r}: tiny or 30b")

    def build(tmp: pathlib.Path) -> None:
        with _quiet_transformers():
            build_qwen3_30b(tmp, device, seed, layers, talker_layers)

    return _cached(f"gpu-bench-qwen3_omni_moe-30b-l{layers}-t{talker_layers}-seed{seed}", build)
