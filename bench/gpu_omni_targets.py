"""The omni rows of bench/gpu.py's target table (parts 1 and 2), per family: Qwen2.5-Omni's are
issue 20's (7B layout on a GPU), Qwen3-Omni's issue 24's ratios (30B layout on a GPU); elsewhere
the rows are printed with '-' as their verdict.

Per-token times of a single request: omni's thinker ms/token = (thinker finished - first token) /
(text tokens - 1), talker ms/code likewise from its first and last code (the stages' timings);
transformers' from its own generate (bench/gpu_omni.py: hf_request). p50 over the requests."""

from __future__ import annotations

import argparse
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass

from gpu_family import layout_name
from gpu_targets import Target, pct, verdict


def known(*values: float | None) -> bool:
    return all(v is not None and not math.isnan(v) for v in values)


Check = Callable[..., bool | None]  # the measured values -> met; None: not measured


@dataclass(frozen=True)
class Goals:
    """A family's targets: the text shown, and its check (None: no target, '-')."""

    first_audio: tuple[str, Check]  # (omni p50 s, transformers s)
    single: tuple[str, Check | None]  # (omni req/s over transformers')
    per_token: tuple[str, Check | None]  # (thinker s, talker s)
    concurrent: tuple[str, Check]  # (req/s ratio at 16, first-audio p99 s, p50 s at 1)
    rtf: tuple[str, Check | None]  # (RTF p50)


GOALS = {
    "qwen2_5_omni": Goals(
        first_audio=("<= 500 ms", lambda ours, hf: ours <= 0.5),
        single=(">= 1.5x", lambda ratio: None if ratio is None else ratio >= 1.5),
        per_token=("<= 10 ms / <= 5 ms", lambda thinker, talker: thinker <= 0.010 and talker <= 0.005
                   if known(thinker, talker) else None),
        concurrent=(">= 10x, p99 <= 1.5 s", lambda ratio, p99, p50: ratio >= 10 and p99 <= 1.5
                    if known(ratio) else None),
        rtf=("< 0.3", lambda rtf: rtf < 0.3),
    ),
    "qwen3_omni_moe": Goals(
        first_audio=(">= 5x sooner than transformers' waveform",
                     lambda ours, hf: hf >= 5 * ours if known(hf) else None),
        single=("-", None),
        per_token=("-", None),
        concurrent=(">= 3x, p99 <= 3x p50 at 1", lambda ratio, p99, p50: ratio >= 3 and p99 <= 3 * p50
                    if known(ratio, p50) else None),
        rtf=("-", None),
    ),
}  # fmt: skip


def omni_targets(hf: dict | None, ours: dict | None, args: argparse.Namespace) -> list[Target]:
    goals = GOALS[args.fam.name]
    # verdicts only on the issue's layout on a GPU (a --layers cut is not the issue's layout)
    issue = args.size == args.fam.sizes[0] and args.device == "cuda" and not args.layers_cut
    hf_rps = 1 / statistics.mean(r["e2e"] for r in hf["rows"]) if hf else None
    hf_e2e_ms = f"{1e3 / hf_rps:,.0f} ms" if hf_rps else "n/a"
    levels = dict(ours["levels"]) if ours is not None else {}
    rows: list[Target] = []
    per = "code" if args.fam.name == "qwen2_5_omni" else "frame"

    def rps(level: dict) -> float:
        return len(level["rows"]) / level["wall"]

    def judge(check: Check | None, *values: float | None) -> str:
        return verdict(check(*values) if issue and check is not None else None)

    single = levels.get("single")
    p50_single = None
    if single is not None:
        got = single["rows"]
        p50_single = pct([r["ttfa"] for r in got], 50)
        hf_s = 1 / hf_rps if hf_rps else None
        sooner = f" ({hf_s / p50_single:.1f}x sooner)" if hf_s else ""
        rows.append(
            (
                f"{layout_name(args)}, first audio, one request (p50)",
                f"{p50_single * 1e3:,.0f} ms{sooner}",
                hf_e2e_ms,
                goals.first_audio[0],
                judge(goals.first_audio[1], p50_single, hf_s),
            )
        )
        ratio = rps(single) / hf_rps if hf_rps else None
        rows.append(
            (
                "same, req/s one at a time",
                f"{ratio:.2f}x HF" if ratio else f"{rps(single):.3f} req/s",
                "1.00" if hf_rps else "n/a",
                goals.single[0],
                judge(goals.single[1], ratio),
            )
        )
        thinker = _per_token(got, "thinker", "text")
        talker = _per_token(got, "talker", "codes")
        hf_thinker = pct([r["thinker_s_per_token"] for r in hf["rows"]], 50) if hf else math.nan
        hf_talker = pct([r["talker_s_per_code"] for r in hf["rows"]], 50) if hf else math.nan
        rows.append(
            (
                f"same, one request: thinker per token / talker per {per}",
                f"{_ms(thinker)} / {_ms(talker)} ms",
                f"{_ms(hf_thinker)} / {_ms(hf_talker)} ms" if hf else "n/a",
                goals.per_token[0],
                judge(goals.per_token[1], thinker, talker),
            )
        )
    concurrent = [(label, level) for label, level in levels.items() if label != "single"]
    if concurrent:
        label, level = next(((c, v) for c, v in concurrent if c == "16"), concurrent[0])
        ratio = rps(level) / hf_rps if hf_rps else None
        p99 = pct([r["ttfa"] for r in level["rows"]], 99)
        shown = f"{ratio:.2f}x HF" if ratio else f"{rps(level):.3f} req/s"
        rows.append(
            (
                f"same, {label} at once",
                f"{shown}, first audio p99 {p99:.2f} s",
                "1.00" if hf_rps else "n/a",
                goals.concurrent[0],
                judge(goals.concurrent[1], ratio, p99, p50_single) if label == "16" else "-",
            )
        )
    for label, level in levels.items():
        rtf = pct([r["rtf"] for r in level["rows"]], 50)
        rows.append(
            (
                f"same, RTF p50 at C={label}",
                f"{rtf:.3f}",
                _hf_rtf(hf),
                goals.rtf[0],
                judge(goals.rtf[1], rtf),
            )
        )
    return rows


def _per_token(rows: list[dict], stage: str, count: str) -> float:
    """p50 over requests of (stage finished - first token) / (tokens - 1), seconds (nan when a
    request made one token or its timings are missing)."""
    values = [
        (r[f"{stage} finished_s"] - r[f"{stage} first_token_s"]) / (r[count] - 1)
        if r[count] > 1 and f"{stage} finished_s" in r and f"{stage} first_token_s" in r
        else float("nan")
        for r in rows
    ]
    return pct(values, 50)


def _ms(seconds: float) -> str:
    return "n/a" if math.isnan(seconds) else f"{seconds * 1e3:.1f}"


def _hf_rtf(hf: dict | None) -> str:
    return "-" if hf is None else f"{pct([r['rtf'] for r in hf['rows']], 50):.2f}"
