"""Kernels per DiT evaluation of a streamed token2wav chunk: transformers' own layers (float32
weights under autocast) against omni's evaluation (stages/qwen2_5_omni/token2wav_dit.py: its
Linear weights stored in the autocast dtype, masks built once per reach, the time embedding's
SiLU once, the first head's query and key rotated together), counted on the CPU.

A chunk's step on a GPU is bound by its kernels, not its arithmetic: 36 DiT evaluations a chunk
(RK4, 10 time points), each a replayed CUDA graph of small kernels (on the H200, a batch of one
first chunk took as long as a batch of eight). So the count of kernel-launching aten ops per
evaluation (views, reshapes and other metadata-only ops left out) is what a graph replays; this
bench counts them with a dispatch mode, for Qwen2.5-Omni-7B's DiT layout (transformers'
Qwen2_5OmniDiTConfig defaults: 22 blocks of 1024, random weights) or the tiny test layout, and
checks that both give the same velocity bit for bit. Timing needs a GPU (bench/gpu.py's omni
part); nothing here is timed.

    python bench/dit_kernels.py [--layout 7b|tiny] [--rows 1] [--frames 48] [--dtype float16]
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
from bench_table import table  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from transformers.models.qwen2_5_omni.configuration_qwen2_5_omni import (  # noqa: E402
    Qwen2_5OmniDiTConfig,
)
from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import (  # noqa: E402
    Qwen2_5OmniToken2WavDiTModel,
)

from stages.qwen2_5_omni.token2wav_chunks import _block_diff  # noqa: E402
from stages.qwen2_5_omni.token2wav_dit import (  # noqa: E402
    dit_velocity,
    matmul_copy,
)

# Ops that only make views or read metadata: no kernel on a GPU.
NO_KERNEL = {
    "view", "_unsafe_view", "reshape", "t", "transpose", "unsqueeze", "squeeze", "slice",
    "select", "expand", "permute", "split", "chunk", "detach", "alias", "as_strided", "unbind",
    "_reshape_alias", "lift_fresh", "empty", "empty_like", "size", "stride",
}  # fmt: skip


class Kernels(TorchDispatchMode):
    """Aten ops dispatched, by name; `kernels` leaves out NO_KERNEL and ops that return their
    input as it is (autocast's cast to the same dtype, dropout in eval mode), but not in-place
    ops (copy_ into a slice). Composite ops count once (a Linear's matmul and bias, attention)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if args and out is args[0] and not name.endswith("_"):  # in place (copy_): a kernel
            name += " (no-op)"
        self.ops[name] += 1
        return out

    @property
    def kernels(self) -> int:
        return sum(n for op, n in self.ops.items() if op not in NO_KERNEL and "no-op" not in op)


def build(layout: str) -> torch.nn.Module:
    if layout == "7b":
        config = Qwen2_5OmniDiTConfig()
    else:
        config = Qwen2_5OmniDiTConfig(
            hidden_size=64, num_hidden_layers=2, num_attention_heads=4, ff_mult=2, emb_dim=32,
            enc_emb_dim=16, enc_channels=[32, 32, 32, 32, 96], enc_dim=32, look_ahead_layers=[1],
            look_backward_layers=[0, 1],
        )  # fmt: skip
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return Qwen2_5OmniToken2WavDiTModel(config).float().eval()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layout", default="7b", choices=["7b", "tiny"])
    p.add_argument("--rows", type=int, default=1, help="chunks in the batch (CFG doubles them)")
    p.add_argument("--frames", type=int, default=48, help="mel frames of the padded window")
    p.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    args = p.parse_args()
    dtype = getattr(torch, args.dtype)
    dit = build(args.layout)
    generator = torch.Generator().manual_seed(1)
    rows, frames = args.rows, args.frames
    state = torch.randn(rows, frames, dit.mel_dim, generator=generator)
    width = dit.input_embed.proj.in_features - dit.mel_dim
    static = torch.randn(2 * rows, frames, width, generator=generator)
    cos, sin = dit.rotary_embed(state, torch.arange(frames).repeat(2 * rows, 1))
    block_diff = _block_diff([frames] * rows, frames, dit.block_size)
    inputs = (static, cos, sin, block_diff, torch.full((rows, 1, 1), 0.5))
    time = torch.tensor(0.3)
    autocast = None if dtype == torch.float32 else dtype
    with torch.inference_mode(), Kernels() as theirs:
        want = dit_velocity(dit, time, state, *inputs, autocast=autocast, own_layers=True)
    ours_dit = dit if autocast is None else matmul_copy(dit, autocast)
    with torch.inference_mode(), Kernels() as ours:
        got = dit_velocity(ours_dit, time, state, *inputs, autocast=autocast)
    same = torch.equal(got, want)
    print(
        f"DiT layout {args.layout} ({len(dit.transformer_blocks)} blocks), {rows} chunk(s) x "
        f"{frames} frames, matmuls in {args.dtype}; the same velocity bit for bit: {same}\n"
    )
    header = ("evaluation", "kernels", "per block", "casts", "vs transformers")
    rows_out = []
    for name, counter in (("transformers' layers", theirs), ("omni (token2wav_dit)", ours)):
        casts = counter.ops["to"] + counter.ops["_to_copy"]
        rows_out.append(
            (
                name,
                str(counter.kernels),
                f"{counter.kernels / len(dit.transformer_blocks):.1f}",
                str(casts),
                f"{counter.kernels / theirs.kernels:.2f}x",
            )
        )
    table(header, rows_out)
    print(f"\na chunk's 36 evaluations: {36 * theirs.kernels:,} -> {36 * ours.kernels:,} kernels")
    if not same:
        raise SystemExit("the velocities differ")


if __name__ == "__main__":
    main()
