"""The tables and verdicts bench/gpu.py prints: report_omni (omni vs transformers, where the
time goes, the targets), report_prefix and report_steps (the decoder parts)."""

from __future__ import annotations

import argparse
import math
import statistics

import numpy as np
from bench_table import table
from gpu_timing import StepRecord
from gpu_workload import STAGES

ISSUE_SCALE = (
    "for scale (the issue, one H100, 7B layout, same workload): transformers takes about "
    "7.6 s per request, all before the first audio (RTF 1.5, 0.14 requests/s one by one)"
)


def gib(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def pct(values: list[float], q: float) -> float:
    """The q-th percentile, linearly interpolated (with few values p99 is about the max)."""
    clean = [v for v in values if not math.isnan(v)]
    return float(np.percentile(clean, q)) if clean else float("nan")


def report_omni(hf: dict | None, ours: dict | None, args: argparse.Namespace) -> None:
    print(
        f"\n## Qwen2.5-Omni ({args.size} layout): omni vs transformers, {args.prompt_tokens}-token "
        f"prompt, {args.text_tokens} text tokens, {args.codec_tokens} codec codes"
    )
    notes = []
    if hf is not None:
        notes.append(
            f"transformers: load {hf['load_s']:.1f} s, {len(hf['rows'])} requests one by one after"
            f" a warm-up; GPU memory left after dropping it {gib(hf['left'])} GiB"
        )
    if ours is not None:
        seqs = ", ".join(f"{n} {e.max_num_seqs}" for n, e in ours["config"].items())
        blocks = ", ".join(
            f"{n} {e.num_blocks}" for n, e in ours["config"].items() if e.num_blocks is not None
        )
        notes.append(
            f"omni: startup {ours['startup_s']:.1f} s (peak {gib(ours['load_peak'])} GiB after "
            f"it), {args.warmup} warm-up requests; max_num_seqs {seqs}; num_blocks {blocks}; "
            f"GPU memory left after shutdown {gib(ours['left'])} GiB"
        )
    for note in notes:
        print(note)
    print(
        "C = requests launched at once (single: one after another); TTFT / TTFA / e2e from each "
        "request's launch; RTF = pipeline time / audio s per request; req/s: transformers = "
        "1 / mean generate time, omni = requests / wall of the level; x HF = req/s over "
        "transformers'; peak = torch.cuda.max_memory_allocated over the level (weights "
        "included)\n"
    )
    hf_rps = 1 / statistics.mean(r["e2e"] for r in hf["rows"]) if hf else None

    def row(name: str, c: str, rows: list[dict], rps: float, peak: float | None) -> tuple:
        def ms(key: str, q: float) -> str:
            return f"{pct([r[key] for r in rows], q) * 1e3:.0f}"

        return (
            name,
            c,
            str(len(rows)),
            f"{rps:.3f}",
            f"{rps / hf_rps:.2f}x" if hf_rps else "-",
            ms("ttft", 50),
            ms("ttft", 99),
            ms("ttfa", 50),
            ms("ttfa", 99),
            f"{pct([r['rtf'] for r in rows], 50):.3f}",
            f"{pct([r['e2e'] for r in rows], 50):.2f}",
            f"{statistics.mean(r['audio_s'] for r in rows):.2f}",
            f"{min(r['text'] for r in rows)}/{min(r['codes'] for r in rows)}",
            gib(peak),
        )

    header = (
        "system",
        "C",
        "reqs",
        "req/s",
        "x HF",
        "TTFT p50 ms",
        "TTFT p99 ms",
        "TTFA p50 ms",
        "TTFA p99 ms",
        "RTF p50",
        "e2e p50 s",
        "audio s/req",
        "min text/codes",
        "peak GiB",
    )
    rows = []
    if hf is not None and hf_rps is not None:
        rows.append(row("transformers", "1-by-1", hf["rows"], hf_rps, hf["peak"]))
    levels = dict(ours["levels"]) if ours is not None else {}
    for label, level in levels.items():
        rps = len(level["rows"]) / level["wall"]
        rows.append(row("omni", label, level["rows"], rps, level["peak"]))
    table(header, rows)

    if levels:
        print(
            "\nomni, where the time goes: p50 s since each request was added (the stages' "
            "timings); engine steps and preemptions during the level"
        )
        where_header = (
            "C",
            "thinker 1st tok",
            "thinker done",
            "talker 1st code",
            "talker done",
            "first audio",
            "audio done",
            "steps thinker/talker/t2w",
            "preemptions",
        )
        where = []
        for label, level in levels.items():
            got = level["rows"]

            def p50(key: str, got: list[dict] = got) -> str:
                return f"{pct([r.get(key, float('nan')) for r in got], 50):.3f}"

            cnt = level["counters"]
            steps = "/".join(f"{cnt.get(f'{s} steps', 0):.0f}" for s in STAGES)
            pre = sum(cnt.get(f"{s} preemptions", 0.0) for s in STAGES)
            where.append(
                (
                    label,
                    p50("thinker first_token_s"),
                    p50("thinker finished_s"),
                    p50("talker first_token_s"),
                    p50("talker finished_s"),
                    p50("token2wav first_audio_s"),
                    p50("token2wav finished_s"),
                    steps,
                    f"{pre:.0f}",
                )
            )
        table(where_header, where)

    print("\ntargets (same GPU and workload; reported, never asserted):")
    single = levels.get("single")
    if single is not None:
        ttfa = pct([r["ttfa"] for r in single["rows"]], 50) * 1e3
        print(
            f"  first audio, single request: p50 {ttfa:.0f} ms (target < 500 ms): {_ok(ttfa < 500)}"
        )
    for label, level in levels.items():
        if label == "single" or hf_rps is None:
            continue
        ratio = len(level["rows"]) / level["wall"] / hf_rps
        goal = " (target >= 10x at 16)" if label == "16" else ""
        verdict = f": {_ok(ratio >= 10)}" if label == "16" else ""
        print(
            f"  throughput at {label} concurrent: {ratio:.2f}x transformers one by one{goal}{verdict}"
        )
    for label, level in levels.items():
        rtf = pct([r["rtf"] for r in level["rows"]], 50)
        print(f"  RTF p50 at C={label}: {rtf:.3f} (target < 0.3): {_ok(rtf < 0.3)}")
    if hf is not None:
        hf_e2e = statistics.mean(r["e2e"] for r in hf["rows"])
        hf_rtf = pct([r["rtf"] for r in hf["rows"]], 50)
        print(f"  transformers here: {hf_e2e:.2f} s per request, RTF {hf_rtf:.2f}")
    if args.size == "7b":
        print(f"  {ISSUE_SCALE}")


def _ok(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def report_prefix(results: dict[bool, tuple[list[dict], float | None]], args) -> None:
    n = args.prefix_requests
    print(
        f"\n## Decoder ({args.decoder_layout} layout): time to first token on a shared "
        f"{args.prefix_tokens}-token prefix"
    )
    print(
        f"{n} requests one after another, each the prefix + its own {args.suffix_tokens}-token "
        f"suffix, max_tokens=1, after a warm-up request of the same length; "
        f"max_num_batched_tokens {args.llm_batched_tokens}; request 1 is cold either way. "
        f"Peak GPU memory: caching on {gib(results[True][1])} GiB, off {gib(results[False][1])} "
        "GiB\n"
    )
    rows = []
    for i in range(n):
        on, off = results[True][0][i], results[False][0][i]
        rows.append(
            (
                str(i + 1),
                f"{on['ttft'] * 1e3:.1f}",
                f"{on['hit']:.0f}/{args.prefix_tokens + args.suffix_tokens}",
                f"{off['ttft'] * 1e3:.1f}",
                f"{off['hit']:.0f}",
                f"{off['ttft'] / on['ttft']:.2f}x",
            )
        )
    header = ("req", "TTFT on ms", "hit tokens on", "TTFT off ms", "hit off", "off / on")
    table(header, rows)
    if n > 1:
        on = statistics.mean(r["ttft"] for r in results[True][0][1:])
        off = statistics.mean(r["ttft"] for r in results[False][0][1:])
        print(
            f"\nrequests 2..{n}: TTFT caching on {on * 1e3:.1f} ms, off {off * 1e3:.1f} ms: "
            f"{off / on:.2f}x faster with caching"
        )


def report_steps(levels: list[dict], args: argparse.Namespace) -> None:
    print(
        f"\n## Decoder ({args.decoder_layout} layout): scheduler + bookkeeping CPU time per "
        "decode step"
    )
    print(
        f"B requests ({args.decode_prompt_tokens}-token distinct prompts, {args.decode_tokens} "
        "tokens each, ignore_eos) launched at once; decode steps = steps feeding one token per "
        "request with all B scheduled. schedule / update: the stepping thread's CPU time in "
        "scheduler.schedule and StageEngine.update; execute: wall time of runner.execute; step: "
        "wall time of StageEngine.step; host: the rest of the StageHost turn around the step "
        "(inbox, events); sched+update wall: their wall time (above the CPU time when the thread "
        "waits, e.g. for the GIL). share = (schedule + update CPU time) / step\n"
    )
    header = (
        "B",
        "decode steps",
        "schedule us",
        "update us",
        "execute ms",
        "step ms",
        "share of step",
        "sched+update wall us",
        "host extra us",
        "all steps",
        "tok/s",
    )
    rows = []
    for level in levels:
        batch, records = level["batch"], level["records"]
        decode: list[StepRecord] = [r for r in records if r.decode and r.batch == batch]
        if not decode:
            rows.append((str(batch), "0", *["-"] * 7, str(len(records)), "-"))
            continue

        def mean(values: list[float]) -> float:
            return statistics.mean(values)

        sched = mean([r.schedule_cpu_s for r in decode])
        update = mean([r.update_cpu_s for r in decode])
        execute = mean([r.execute_s for r in decode])
        step = mean([r.step_s for r in decode])
        host = mean([r.host_s - r.step_s for r in decode])
        wall = mean([r.schedule_s + r.update_s for r in decode])
        rows.append(
            (
                str(batch),
                str(len(decode)),
                f"{sched * 1e6:.0f}",
                f"{update * 1e6:.0f}",
                f"{execute * 1e3:.2f}",
                f"{step * 1e3:.2f}",
                f"{(sched + update) / step:.1%}",
                f"{wall * 1e6:.0f}",
                f"{host * 1e6:.0f}",
                str(len(records)),
                f"{batch / step:.0f}",
            )
        )
    table(header, rows)
