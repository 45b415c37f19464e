"""The 3-stage Qwen2.5-Omni pipeline (thinker -> talker -> token2wav) against transformers.

Three parts, each a function of (model dir, args) that runs its part and prints its tables:

1. Throughput (here: throughput_section): N mixed requests (half image + text, half text only;
   all distinct) submitted at once to our pipeline (`Omni.stream`) versus transformers' full
   `Qwen2_5OmniForConditionalGeneration.generate` run request by request (first, in a child
   process: see omni_bench_support.in_child), on the same weights and inputs with the same
   budgets (thinker exactly --thinker-tokens, greedy talker up to
   --talker-tokens stopping at the codec EOS ids, one DiT pass). Requests/s, generated thinker
   tokens/s and time to first audio (ours: submit -> first token2wav result; transformers: the
   first request's `generate` returning).
2. Shared long prefix (bench/omni_prefix.py: prefix_section): a system prompt plus a long
   document, then different short questions, one request after another, prefix caching on
   versus off: thinker time to first token (a pass with
   thinker max_tokens=1, leaving the stream at the thinker result), thinker finish and talker
   start (= thinker result arrival), talker and audio arrival, and the hit rates
   (num_cached_tokens / num_prompt_tokens) of thinker and talker. Each pass uses its own
   document, so its first request is always a cold miss.
3. Concurrency x streaming (bench/omni_streaming.py: concurrency_section): for C in
   --concurrency (1, 4, 16) and speech streaming off / on, C distinct requests launched at once
   through AsyncOmni.generate (stream_audio), each level run
   until it has --speech-samples requests (C=1: that many one after another), with longer speech
   (--speech-talker-tokens codes, so that the vocoder's chunks matter): time to first audio (the
   first snapshot carrying audio, from the launch), end to end, RTF (the request's pipeline time
   per second of audio, timings["rtf"]) and requests/s, against transformers' generate on
   --hf-requests requests one by one (its first audio is its whole generate), and the issue's
   target ratios and the vocoder-bound throughput ceiling (each level's "other CPU" says whether
   other processes disturbed it).

What the parts share (prompt material, building requests and the Omni, our stream loop, the
transformers side, CPU accounting, tables) is in bench/omni_bench_support.py. This file holds
part 1 and the command line: only it is run.

Timings only: nothing is asserted. The checkpoint has random weights, so text and audio are noise.

With --family qwen3_omni_moe it runs bench/qwen3_streaming.py instead (Qwen3-Omni streaming
speech against transformers' generate: first audio, throughput at 16, joined stream vs whole).

    .venv/bin/python bench/omni_pipeline.py [--family qwen2_5_omni|qwen3_omni_moe]
        [--size bench|tiny] [--backend local|ray]
        [--requests 16] [--thinker-tokens 16] [--talker-tokens 48] [--threads 2]
        [--concurrency 1,4,16] [--speech-thinker-tokens 32] [--speech-talker-tokens 128]
        [--speech-samples 8] [--hf-requests 5] [--max-num-seqs N] [--chunk-size N]
        [--first-chunk-size N] [--skip throughput|prefix|concurrency ...]
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # tools/ is not an installed package
sys.path.insert(0, str(REPO / "bench"))
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


import argparse  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
from bench_table import table  # noqa: E402
from omni_bench_support import (  # noqa: E402
    CODEC_EOS,
    SEED,
    cpu_clock,
    hf_throughput,
    in_child,
    make_omni,
    mixed_requests,
    other_cores,
    prepare_model,
    run_ours,
    stage_params,
)
from omni_prefix import prefix_section  # noqa: E402
from omni_streaming import concurrency_section  # noqa: E402


# ---- 1. throughput -------------------------------------------------------------------------------
def throughput_section(model_dir: str, args) -> None:
    n = args.requests
    requests = mixed_requests(n)
    warm = mixed_requests(2, offset=n)  # distinct prompts and images: nothing cached for later
    params = stage_params(args)

    hf = in_child(hf_throughput, model_dir, warm[0], requests, args)  # first: nothing else runs
    t0 = time.perf_counter()
    with make_omni(model_dir, args) as omni:
        startup = time.perf_counter() - t0
        run_ours(omni, warm, params)
        ours = run_ours(omni, requests, params)

    print(f"\n## 1. Throughput: {n} requests ({(n + 1) // 2} image + text, {n // 2} text only)")
    print(
        f"thinker {args.thinker_tokens} tokens (ignore_eos), talker <= {args.talker_tokens} codes "
        f"(greedy, stop {CODEC_EOS}), token2wav 1 pass (seed {SEED}); ours: all {n} submitted "
        f"at once via Omni.stream (stage startup {startup:.1f} s, not timed); transformers: "
        "generate() request by request; both warmed up once"
    )
    rows = []
    for name, r in (("omni (ours)", ours), ("transformers", hf)):
        tokens = sum(len(t) for t in r["thinker"])
        codes = sum(len(c) for c in r["codes"])
        rows.append(
            (
                name,
                f"{r['wall']:.2f}",
                f"{n / r['wall']:.2f}",
                f"{tokens / r['wall']:.1f}",
                f"{r['ttfa']:.2f}",
                str(tokens),
                str(codes),
                f"{r['audio_s']:.1f}",
            )
        )
    header = (
        "",
        "wall s",
        "req/s",
        "thinker tok/s",
        "first audio s",
        "thinker toks",
        "talker codes",
        "audio s",
    )
    table(header, rows)
    same_t = sum(a == b for a, b in zip(ours["thinker"], hf["thinker"], strict=True))
    same_c = sum(a == b for a, b in zip(ours["codes"], hf["codes"], strict=True))
    print(
        f"\nratios: throughput {hf['wall'] / ours['wall']:.2f}x (ours / transformers req/s), "
        f"time to first audio {hf['ttfa'] / ours['ttfa']:.2f}x (transformers / ours; "
        "> 1 = ours sooner)"
    )
    print(f"same tokens as transformers: thinker {same_t}/{n}, talker codes {same_c}/{n}")
    done = ", ".join(f"{stage} {t:.2f} s" for stage, t in ours["last"].items())
    print(f"ours, each stage's last result after submit: {done}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="Qwen2.5-Omni checkpoint dir (default: built --size)")
    parser.add_argument("--size", default="bench", choices=["bench", "tiny"])
    parser.add_argument(
        "--family", default="qwen2_5_omni", choices=["qwen2_5_omni", "qwen3_omni_moe"]
    )
    parser.add_argument("--backend", default="local", choices=["local", "ray"])
    parser.add_argument("--threads", type=int, default=2, help="torch threads in this process")
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--thinker-tokens", type=int, default=16)
    parser.add_argument("--talker-tokens", type=int, default=48)
    parser.add_argument("--questions", type=int, default=4)
    parser.add_argument("--doc-tokens", type=int, default=1000)
    parser.add_argument(
        "--talker-mode",
        default="unmasked",
        choices=["unmasked", "masked"],
        help="talker input path: unmasked = what transformers' single-request generate runs",
    )
    parser.add_argument(
        "--concurrency", default="1,4,16", help="part 3: requests launched at once, per level"
    )
    parser.add_argument("--speech-thinker-tokens", type=int, default=32, help="part 3")
    parser.add_argument("--speech-talker-tokens", type=int, default=128, help="part 3")
    parser.add_argument(
        "--speech-samples", type=int, default=8, help="part 3: at least this many requests a level"
    )
    parser.add_argument(
        "--hf-requests", type=int, default=5, help="part 3: transformers requests (+1 warm-up)"
    )
    parser.add_argument(
        "--max-num-seqs", type=int, help="part 3: every stage's engine.max_num_seqs (config's)"
    )
    parser.add_argument("--chunk-size", type=int, help="part 3: the vocoder's stream.chunk_size")
    parser.add_argument(
        "--first-chunk-size", type=int, help="part 3: token2wav stream.first_chunk_size"
    )
    parser.add_argument(
        "--skip",
        action="append",
        default=[],
        choices=["throughput", "prefix", "concurrency"],
        help="leave a part out (repeatable)",
    )
    args = parser.parse_args()
    model_dir, setup = prepare_model(args)
    if args.family == "qwen3_omni_moe":
        from qwen3_streaming import qwen3_section

        print(f"# Qwen3-Omni streaming benchmark (random weights)\n{setup}")
        clock = cpu_clock()
        qwen3_section(model_dir, args)
        print(f"(other processes took {other_cores(clock, cpu_clock()):.2f} cores meanwhile)")
        return
    print("# Qwen2.5-Omni pipeline benchmark (random weights)")
    print(
        f"{setup}, talker input path {args.talker_mode}, torch {torch.__version__}, "
        f"load average at start {os.getloadavg()[0]:.2f}"
    )
    start = time.perf_counter()
    for part, section in (
        ("throughput", throughput_section),
        ("prefix", prefix_section),
        ("concurrency", concurrency_section),
    ):
        if part not in args.skip:
            clock = cpu_clock()
            section(model_dir, args)
            who = "other processes" + (
                ", our Ray stage actors included," if args.backend == "ray" else ""
            )
            # More than ~0.1 cores (omni_streaming.DISTURBED) and the timings above were
            # slowed down.
            print(f"({who} took {other_cores(clock, cpu_clock()):.2f} cores meanwhile)")
    # Other processes on the machine distort every timing here (torch's spinning thread teams
    # slow down many times when a core is taken): the load average tells whether there were any.
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"\ntotal {time.perf_counter() - start:.0f} s; load average (1, 5, 15 min) {load}")


if __name__ == "__main__":
    main()
