"""The tables and verdicts bench/gpu.py prints: report_omni (omni vs transformers, where the
time goes, the targets), report_prefix and report_steps (the decoder parts). report_omni and
report_prefix return their rows of issue 20's table (bench/gpu_targets.py); the decode part's
are in bench/gpu_decode_report.py."""

from __future__ import annotations

import argparse
import statistics

from bench_table import table
from gpu_family import layout_name
from gpu_omni_targets import omni_targets
from gpu_targets import Target, pct, print_targets, verdict
from gpu_timing import StepRecord
from playback import gap_summary
from step_trace import report as report_trace

ISSUE_SCALE = (
    "for scale (the issue, one H100, 7B layout, same workload): transformers takes about "
    "7.6 s per request, all before the first audio (RTF 1.5, 0.14 requests/s one by one)"
)


def gib(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def report_omni(hf: dict | None, ours: dict | None, args: argparse.Namespace) -> list[Target]:
    print(
        f"\n## {layout_name(args)}: omni vs transformers, {args.prompt_tokens}-token prompt, "
        f"{args.text_tokens} text tokens, {args.codec_tokens} codec {args.fam.unit}"
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
            f"GPU memory left after shutdown {gib(ours['left'])} GiB; vocoder chunks "
            f"{ours.get('vocoder') or '-'}"
        )
    for note in notes:
        print(note)
    print(
        "C = requests launched at once (single: one after another); TTFT / TTFA / e2e from each "
        "request's launch; RTF = pipeline time / audio s per request; req/s: transformers = "
        "1 / mean generate time, omni = requests / wall of the level; x HF = req/s over "
        "transformers'; gaps: the silence a listener playing each request's audio as it comes "
        "hears after its first audio (requests with any); peak = "
        "torch.cuda.max_memory_allocated over the level (weights included)\n"
    )
    hf_rps = 1 / statistics.mean(r["e2e"] for r in hf["rows"]) if hf else None

    def silences(rows: list[dict]) -> str:
        """The silence a listener hears after the first audio (bench/playback.py)."""
        gaps = gap_summary(rows)
        if gaps is None:
            return "-"
        return f"{gaps[0] * 1e3:.0f} / {gaps[1] * 1e3:.0f} ({gaps[2]}/{len(rows)})"

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
            silences(rows),
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
        "gaps ms p50/p99 (reqs)",
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

    stages, vocoder = args.fam.stages, args.fam.stages[2]
    if levels:
        print(
            "\nomni, where the time goes: p50 s since each request was added (the stages' "
            "timings); engine steps, preemptions, steps launched ahead, steps replayed as CUDA "
            "graphs and Triton kernel "
            "variants compiled during the level"
        )
        where_header = (
            "C",
            "thinker 1st tok",
            "thinker done",
            "talker routed",
            "talker 1st code",
            "talker done",
            "vocoder routed",
            "first audio",
            "audio done",
            "steps " + "/".join(stages),
            "step ms " + "/".join(stages),
            "preemptions",
            "ahead " + "/".join(stages[:2]),
            "graph " + "/".join(stages[:2]),
            "Triton compiles",
            "full GCs",
        )
        where = []
        for label, level in levels.items():
            got = level["rows"]

            def p50(key: str, got: list[dict] = got) -> str:
                return f"{pct([r.get(key, float('nan')) for r in got], 50):.3f}"

            cnt = level["counters"]
            steps = "/".join(f"{cnt.get(f'{s} steps', 0):.0f}" for s in stages)
            # Mean time in a stage's step() during the level (busy_s / steps): slow steps show.
            step_ms = "/".join(
                f"{1e3 * cnt.get(f'{s} busy_s', 0.0) / max(cnt.get(f'{s} steps', 0.0), 1):.1f}"
                for s in stages
            )
            pre = sum(cnt.get(f"{s} preemptions", 0.0) for s in stages)
            ahead = "/".join(f"{cnt.get(f'{s} steps_launched_ahead', 0):.0f}" for s in stages[:2])
            graph = "/".join(f"{cnt.get(f'{s} graph_steps', 0):.0f}" for s in stages[:2])
            where.append(
                (
                    label,
                    p50("thinker first_token_s"),
                    p50("thinker finished_s"),
                    p50("talker started_s"),
                    p50("talker first_token_s"),
                    p50("talker finished_s"),
                    p50(f"{vocoder} started_s"),
                    p50(f"{vocoder} first_audio_s"),
                    p50(f"{vocoder} finished_s"),
                    steps,
                    step_ms,
                    f"{pre:.0f}",
                    ahead,
                    graph,
                    f"{cnt.get('triton compiles', 0):.0f}",
                    f"{cnt.get('full gcs', 0):.0f}",
                )
            )
        table(where_header, where)
        report_trace([(label, level.get("trace", {})) for label, level in levels.items()])

    targets = omni_targets(hf, ours, args)
    print_targets(targets, "omni targets")
    if args.fam.name == "qwen2_5_omni" and args.size == "7b":
        print(ISSUE_SCALE)
    return targets


def report_prefix(
    results: dict[bool, tuple[list[dict], float | None]], args: argparse.Namespace
) -> list[Target]:
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
                f"{on['steps']}",
            )
        )
    header = ("req", "TTFT on ms", "hit tokens on", "TTFT off ms", "hit off", "off / on")
    header += ("steps on: graph/long/eager",)
    table(header, rows)
    warm = slice(1, None) if n > 1 else slice(None)  # request 1 is cold either way
    on = statistics.mean(r["ttft"] for r in results[True][0][warm])
    off = statistics.mean(r["ttft"] for r in results[False][0][warm])
    which = f"requests 2..{n}" if n > 1 else "request 1"
    print(
        f"\n{which}: TTFT caching on {on * 1e3:.1f} ms, off {off * 1e3:.1f} ms: "
        f"{off / on:.2f}x faster with caching"
    )
    issue = args.decoder_layout == "0.5b" and args.device == "cuda" and args.prefix_tokens == 4096
    targets: list[Target] = [
        (
            f"{args.prefix_tokens}-token shared prefix, TTFT cached vs uncached ({which})",
            f"{on * 1e3:.1f} vs {off * 1e3:.1f} ms ({off / on:.2f}x)",
            "-",
            "cached >= 4x faster, <= 6 ms",
            verdict(off / on >= 4 and on <= 0.006 if issue else None),
        )
    ]
    print_targets(targets, "prefix targets")
    return targets


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
