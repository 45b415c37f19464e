"""GPU benchmark: Qwen2.5-Omni at the 7B layout, omni against transformers, plus a 0.5B decoder;
with --family qwen3_omni_moe, Qwen3-Omni at the 30B-A3B layout (parts 1 and 2 only).

Prints the device, then (each part optional, see --skip):

1. hf: transformers' `Qwen2_5OmniForConditionalGeneration.generate`, one request after another
   (after a warm-up): a --prompt-tokens prompt, exactly --text-tokens thinker tokens and
   --codec-tokens codec codes (the random checkpoint's codec-head rows of the codec EOS ids are
   zero, so greedy decoding never stops early, on either side), one token2wav pass. TTFT: the
   thinker's second forward starting (its first token sampled); its first audio is the end of
   the whole generate.
2. omni: the same checkpoint and budgets through our pipeline (AsyncOmni.generate with
   stream_audio: talker started early, vocoder in chunks), runtime backend local: --single
   requests one after another, then for each N in --requests, N distinct requests launched at
   once. Per request, from its launch: TTFT (first snapshot with a thinker token), TTFA (first
   snapshot carrying audio), RTF (timings["rtf"]: pipeline time / audio seconds), e2e.
   Throughput = N / wall of the level; transformers' = 1 / its mean generate time. Peak memory:
   torch.cuda.max_memory_allocated over the level (weights included; n/a on the CPU).
3. prefix: a plain decoder of Qwen2.5-0.5B's layout (random weights) as a one-stage pipeline:
   --prefix-requests requests sharing a --prefix-tokens prefix (each with its own suffix) sent
   one after another, prefix caching on and off: time to first token (max_tokens=1).
4. steps: the same decoder, --decode-batch requests decoding together; the live StageEngine's
   `scheduler.schedule`, `runner.execute`, `update` and `step` (and its host's `run_once`) are
   wrapped with timers: the CPU time of schedule + update per decode step as a share of the step.
5. decode: the same decoder, omni's decode step at each --decode-batch B with CUDA graphs on,
   on with `engine.async_scheduling` (each step launched before the previous one's ids are
   read; --skip ahead leaves it out), that with the stage in a process of its own
   (`runtime.backend: processes`; --skip processes leaves it out; no profile there), and off
   (`engine.cuda_graphs` true / false; on the CPU true is the padded eager path): StageEngine
   step wall time over the steps where all B requests decode, tokens/s, start-up (the AsyncOmni
   constructor, capture included) and the stage's cuda_graph_capture_s / cuda_graph_bytes;
   against transformers' `generate` on the same weights and prompts, batched: dynamic cache and
   `cache_implementation="static"` (compiled with CUDA graphs on a GPU; --skip hf-dynamic /
   hf-static leave one out). --profile adds a torch.profiler window of --profile-steps decode
   steps at B=min(16, max B) in both modes: GPU busy share (kernel time / wall) and kernel and
   graph launches per step.

Each of parts 2, 3 and 5 prints its rows of issue 20's table (what, omni, transformers, target,
met) after its own tables, and all of them are printed again together at the end. A verdict is
given only on the issue's layouts and workload on a GPU ('-' otherwise).

--family qwen3_omni_moe: parts 1 and 2 on Qwen3-Omni (`Qwen3OmniMoeForConditionalGeneration`,
stages thinker -> talker -> code2wav; the decoder parts 3-5 do not depend on the family and are
left out). --codec-tokens counts talker frames (16 codes each, 12.5 frames/s: 64 frames = 5.1 s,
the default); --requests defaults to 16. Layouts (bench/gpu_qwen3_checkpoint.py): 30b, the
published Qwen3-Omni-30B-A3B-Instruct dims with random bf16 weights built on --device (35.3 B
parameters, 70.5 GB: larger than the lent machines' 64 GiB disk), cut with --layers N (thinker
decoder layers of 48, 1.25 GB each) and --talker-layers M (of 20); tiny, the "bench" layout of
tools/tiny_qwen3_omni.py. Its rows carry issue 24's ratio targets (first audio at 1 >= 5x sooner
than transformers' waveform; 16 at once >= 3x transformers' req/s with first-audio p99 <= 3x the
p50 at 1), with a verdict on the uncut 30b layout on a GPU only.

Random weights: the text and the audio are noise; only the timings mean anything. Nothing about
timings is asserted; ratios are against the baseline measured in the same run. A part that fails
is reported (traceback) and the others still run; the exit status is then non-zero.

This file holds the command line and runs the parts: parts 1 and 2 are in bench/gpu_omni.py
(what differs per family in bench/gpu_family.py, their targets in bench/gpu_omni_targets.py),
3 and 4 in bench/gpu_decoder.py, 5 in bench/gpu_decode.py (its tables in
bench/gpu_decode_report.py), their prompts and engine overrides in bench/gpu_workload.py, the
other tables in bench/gpu_report.py, the issue's table in bench/gpu_targets.py, the step timers
and device helpers in bench/gpu_timing.py and the checkpoints in bench/gpu_checkpoints.py and
bench/gpu_qwen3_checkpoint.py.

Checkpoints are written once into the checkpoint cache (<repo>/.cache/checkpoints, or
$OMNI_CACHE_DIR/checkpoints) and reused: the 7B layout takes about 21 GiB of disk, the 0.5B
layout 1 GiB, Qwen3-Omni's 30b layout 65.7 GiB (--layers 24: 37.8 GiB). On the lent GPU machine (no network, no Ray, an older transformers), first run
../shared/tools/device-wheels.sh here, then carry [".whl"] and start the command with its prefix.

    python bench/gpu.py [--device cuda|cpu] [--family qwen2_5_omni|qwen3_omni_moe]
        [--size 7b|30b|tiny] [--layers 48] [--talker-layers 20] [--requests 16,64] [--single 3]
        [--hf-requests 3] [--prompt-tokens 200] [--text-tokens 64] [--codec-tokens 256]
        [--prefix-tokens 4096] [--decode-batch 16,64] [--decode-tokens 128] [--profile]
        [--skip hf|omni|prefix|steps|decode|hf-dynamic|hf-static ...]
    python bench/gpu.py --profile                      # every part, issue 20's table (GPU)
    python bench/gpu.py --profile --skip hf --skip omni --skip prefix --skip steps  # decode only
    python bench/gpu.py --device cpu --size tiny --requests 2 --single 1 --hf-requests 1 \\
        --prefix-tokens 256 --prefix-requests 2 --decode-batch 2,4 --decode-tokens 8 --profile \\
        --skip hf --skip omni                          # a smoke test on a CPU (about a minute)
    python bench/gpu.py --family qwen3_omni_moe --layers 24   # Qwen3-Omni on an H100 (GPU)
    python bench/gpu.py --family qwen3_omni_moe --device cpu --size tiny --requests 2 \
        --single 1 --hf-requests 1 --warmup 1 --prompt-tokens 32 --text-tokens 8 \
        --codec-tokens 8                               # its smoke test on a CPU (about 10 s)
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # tools/ is not an installed package
sys.path.insert(0, str(REPO / "bench"))
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import argparse  # noqa: E402
import asyncio  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import TypeVar  # noqa: E402

import torch  # noqa: E402
from gpu_checkpoints import decoder_checkpoint, omni_checkpoint  # noqa: E402
from gpu_decode import decode_section  # noqa: E402
from gpu_decode_report import report_decode  # noqa: E402
from gpu_decoder import prefix_pass, steps_section  # noqa: E402
from gpu_family import FAMILIES, layout_name  # noqa: E402
from gpu_omni import hf_section, omni_section  # noqa: E402
from gpu_qwen3_checkpoint import LAYERS, TALKER_LAYERS, qwen3_checkpoint  # noqa: E402
from gpu_report import report_omni, report_prefix, report_steps  # noqa: E402
from gpu_targets import Target, print_targets  # noqa: E402
from gpu_timing import device_line, release, time_stage_processes  # noqa: E402

from tools.make_tiny_checkpoint import count_parameters  # noqa: E402

T = TypeVar("T")


# ---- main ----------------------------------------------------------------------------------------
def int_list(text: str) -> list[int]:
    values = [int(x) for x in text.split(",") if x.strip()]
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers like 16,64, got {text!r}")
    return values


def share_list(text: str) -> list[float]:
    values = [float(x) for x in text.split(",") if x.strip()]
    if len(values) != 3 or not all(0 < v <= 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected three shares in (0, 1], got {text!r}")
    return values


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument(
        "--family",
        default="qwen2_5_omni",
        choices=list(FAMILIES),
        help="the omni model of parts 1 and 2 (qwen3_omni_moe: those two parts only)",
    )
    p.add_argument(
        "--size",
        choices=["7b", "30b", "tiny"],
        help="7b (qwen2_5_omni's default): Qwen2.5-Omni-7B and Qwen2.5-0.5B layouts; 30b "
        "(qwen3_omni_moe's default): Qwen3-Omni-30B-A3B's; tiny: the test layouts (CPU smoke)",
    )
    p.add_argument(
        "--layers",
        type=int,
        default=LAYERS,
        help=f"qwen3_omni_moe 30b: thinker decoder layers (of {LAYERS}; 1.25 GB each in bf16)",
    )
    p.add_argument(
        "--talker-layers",
        type=int,
        default=TALKER_LAYERS,
        help=f"qwen3_omni_moe 30b: talker decoder layers (of {TALKER_LAYERS}; 0.32 GB each)",
    )
    p.add_argument(
        "--requests",
        type=int_list,
        help="omni levels: N at once (default: 16,64; qwen3_omni_moe: 16)",
    )
    p.add_argument("--single", type=int, default=3, help="omni requests one by one (0: none)")
    p.add_argument("--warmup", type=int, default=2, help="omni warm-up requests at once")
    p.add_argument("--hf-requests", type=int, default=3, help="transformers requests (+1 warm-up)")
    p.add_argument("--prompt-tokens", type=int, default=200)
    p.add_argument("--text-tokens", type=int, default=64, help="thinker tokens (ignore_eos)")
    p.add_argument(
        "--codec-tokens",
        type=int,
        help="talker codes (default 256) or qwen3_omni_moe frames (default 64): ~5 s of speech",
    )
    p.add_argument(
        "--max-num-seqs", type=int, default=64, help="thinker and talker engine.max_num_seqs"
    )
    p.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=4096,
        help="thinker and talker (prefill chunk)",
    )
    p.add_argument(
        "--t2w-batch",
        type=int,
        help="vocoder (token2wav, code2wav) max_num_seqs (default: the config's)",
    )
    p.add_argument(
        "--t2w-dtype",
        choices=["float32", "float16", "bfloat16"],
        help="token2wav's streamed-chunk DiT precision (stream.dtype; default: float16 on a GPU)",
    )
    p.add_argument(
        "--t2w-ramp",
        type=int_list,
        help="the vocoder's chunk sizes after the first (stream.ramp, e.g. 20,40; default: the "
        "config's)",
    )
    p.add_argument(
        "--ahead",
        action="store_true",
        help="thinker and talker with engine.async_scheduling (either family; default: off, as "
        "shipped)",
    )
    p.add_argument(
        "--gpu-mem",
        type=share_list,
        default=[0.45, 0.15, 0.1],
        help="gpu_memory_utilization of thinker,talker,vocoder (the decoder takes the first)",
    )
    p.add_argument("--prefix-tokens", type=int, default=4096)
    p.add_argument("--suffix-tokens", type=int, default=32)
    p.add_argument("--prefix-requests", type=int, default=5)
    p.add_argument(
        "--llm-batched-tokens", type=int, default=8192, help="decoder max_num_batched_tokens"
    )
    p.add_argument("--decode-batch", type=int_list, default=[16, 64])
    p.add_argument("--decode-tokens", type=int, default=128)
    p.add_argument("--decode-prompt-tokens", type=int, default=128)
    p.add_argument(
        "--profile",
        action="store_true",
        help="decode part: torch.profiler over a few decode steps, graphs on and off (GPU busy)",
    )
    p.add_argument(
        "--profile-batch",
        type=int_list,
        help="B of each profile window (default: min(16, the largest --decode-batch))",
    )
    p.add_argument("--profile-steps", type=int, default=8, help="decode steps profiled")
    p.add_argument("--profile-skip", type=int, default=3, help="full decode steps before them")
    p.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    p.add_argument("--seed", type=int, default=0, help="checkpoint weights seed")
    p.add_argument(
        "--skip",
        action="append",
        default=[],
        choices=[
            "hf",
            "omni",
            "prefix",
            "steps",
            "decode",
            "hf-dynamic",
            "hf-static",
            "ahead",
            "processes",
        ],  # fmt: skip
        help="leave a part out (repeatable); hf-dynamic / hf-static: a baseline of the decode "
        "part; ahead: its pass with engine.async_scheduling; processes: that pass with the "
        "stage in a process of its own",
    )
    args = p.parse_args(argv)
    args.fam = fam = FAMILIES[args.family]
    args.size = args.size or fam.sizes[0]
    if args.size not in fam.sizes:
        p.error(f"--size {args.size} is not a {fam.name} layout: {' or '.join(fam.sizes)}")
    args.codec_tokens = args.codec_tokens or fam.codec_tokens
    args.requests = args.requests or list(fam.requests)
    args.layers_cut = (args.layers, args.talker_layers) != (LAYERS, TALKER_LAYERS)
    if args.layers_cut and args.size != "30b":
        p.error("--layers / --talker-layers cut the qwen3_omni_moe 30b layout only")
    if not (1 <= args.layers <= LAYERS and 1 <= args.talker_layers <= TALKER_LAYERS):
        p.error(f"--layers must be in 1..{LAYERS} and --talker-layers in 1..{TALKER_LAYERS}")
    if fam.name != "qwen2_5_omni":  # the decoder parts do not depend on the omni family
        args.skip = sorted({*args.skip, "prefix", "steps", "decode"})
    for name in (
        "prompt_tokens", "text_tokens", "codec_tokens", "prefix_requests", "profile_steps",
        "profile_skip",
    ):  # fmt: skip
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.decode_tokens < 2:
        p.error("--decode-tokens must be >= 2 (one prefill token, then decode steps)")
    if args.text_tokens < 2:
        p.error("--text-tokens must be >= 2 (the talker starts from the thinker's second token)")
    args.decoder_layout = "0.5b" if args.size == "7b" else "tiny"
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit(
            f"CUDA is not available (torch {torch.__version__}, torch.cuda.is_available() is "
            "False): run this on a GPU machine, or pass --device cpu (with --size tiny for a "
            "quick smoke test)"
        )
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.fam.name == "qwen2_5_omni":
        print("# GPU benchmark: Qwen2.5-Omni (omni vs transformers) and a plain decoder")
    else:
        print(f"# GPU benchmark: {args.fam.title} (omni vs transformers)")
    print(device_line(args.device), flush=True)
    start = time.perf_counter()
    failed: list[str] = []
    targets: list[Target] = []

    def attempt(part: str, fn: Callable[[], T]) -> T | None:
        """Run one part; a failure is printed and the other parts still run (a short device
        session keeps what did work)."""
        try:
            return fn()
        except Exception:
            traceback.print_exc()
            print(f"\n!! part {part!r} failed (traceback above); going on with the others")
            failed.append(part)
            return None
        finally:
            release(args.device)

    from transformers import AutoTokenizer

    if not {"hf", "omni"} <= set(args.skip):
        omni_dir = prepare(
            f"{layout_name(args)} checkpoint, random weights", lambda: family_checkpoint(args)
        )
        tokenizer = AutoTokenizer.from_pretrained(omni_dir)
        hf = ours = None
        if "hf" not in args.skip:
            hf = attempt("hf", lambda: hf_section(omni_dir, tokenizer, args))
        if "omni" not in args.skip:
            ours = attempt("omni", lambda: asyncio.run(omni_section(omni_dir, tokenizer, args)))
        if hf is not None or ours is not None:
            targets += report_omni(hf, ours, args)

    if not {"prefix", "steps", "decode"} <= set(args.skip):
        decoder_dir = prepare(
            f"\ndecoder checkpoint ({args.decoder_layout} layout, random weights)",
            lambda: decoder_checkpoint(args.decoder_layout, args.device, args.seed),
        )
        tokenizer = AutoTokenizer.from_pretrained(decoder_dir)
        if "prefix" not in args.skip:

            def both() -> dict[bool, tuple[list[dict], float | None]]:
                return {
                    caching: asyncio.run(prefix_pass(decoder_dir, tokenizer, args, caching))
                    for caching in (True, False)
                }

            prefix = attempt("prefix", both)
            if prefix is not None:
                targets += report_prefix(prefix, args)
        if "steps" not in args.skip:
            steps = attempt(
                "steps", lambda: asyncio.run(steps_section(decoder_dir, tokenizer, args))
            )
            if steps is not None:
                report_steps(steps, args)
        if "decode" not in args.skip:
            decode = attempt("decode", lambda: decode_section(decoder_dir, tokenizer, args))
            if decode is not None:
                failed.extend(f"decode ({name})" for name in decode["errors"])
                targets += report_decode(decode, args)
    issue = "Issue 20's table" if args.fam.name == "qwen2_5_omni" else "Issue 24's targets"
    print_targets(targets, f"\n## {issue}, every part of this run")
    print(f"\ntotal {time.perf_counter() - start:.0f} s")
    if failed:
        raise SystemExit(f"parts that failed: {', '.join(failed)}")


def family_checkpoint(args: argparse.Namespace) -> Path:
    if args.fam.name == "qwen2_5_omni":
        return omni_checkpoint(args.size, args.device, args.seed)
    return qwen3_checkpoint(args.size, args.device, args.seed, args.layers, args.talker_layers)


def prepare(label: str, build: Callable[[], Path]) -> str:
    """Build (the first time) or find a cached checkpoint; print where, its size, how long."""
    t0 = time.perf_counter()
    path = build()
    params = count_parameters(path)
    took = time.perf_counter() - t0
    disk = sum(f.stat().st_size for f in path.iterdir() if f.is_file()) / 1024**3
    print(
        f"{label}: {path} ({params / 1e6:,.1f} M parameters, {disk:.2f} GiB on disk, ready in "
        f"{took:.1f} s)",
        flush=True,
    )
    return str(path)


if __name__ == "__mp_main__":  # a stage process of the decode part's "processes" pass
    time_stage_processes()

if __name__ == "__main__":
    main()
