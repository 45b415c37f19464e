"""Part 5 of bench/gpu.py: decode steps on the plain decoder, omni with CUDA graphs on and off
against transformers' generate (dynamic and static cache) on the same weights and GPU.

* omni (omni_pass, once per `engine.cuda_graphs` value, graphs on first): start-up (the
  AsyncOmni constructor: weights, KV pool, warm-up, capture) and the stage's capture stats, then
  bench/gpu_decoder.py's timed_levels: per --decode-batch B, B distinct prompts decoding
  --decode-tokens tokens at once, StageEngine.step timed by StepTimer; only steps where all B
  requests decode one token count. With --profile, one more batch of min(16, max B) requests
  whose full decode steps --profile-skip .. + --profile-steps run under torch.profiler
  (ProfileWindow: started and stopped on the stepping thread, between host turns).
* transformers (hf_pass, per cache implementation): the same prompts batched (same length, no
  padding), greedy, EOS off; ms per decode step = (generate of N tokens - generate of 1 token,
  which is the prefill) / (N - 1), each the best of two after a warm-up generate of its shape
  (`cache_implementation="static"` compiles the decode forward with CUDA graphs on a GPU there;
  on the CPU it runs eagerly, compile off).
"""

from __future__ import annotations

import argparse
import functools
import json
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, cast

import torch
from gpu_decode_modes import Mode, mode_label
from gpu_decoder import decode_batch, decode_overrides, timed_levels
from gpu_timing import StageProcessTimer, StepRecord, StepTimer, release, sync
from gpu_workload import random_ids

from omni import AsyncOmni

API_CATEGORIES = ("cuda_runtime", "cuda_driver")  # CUDA runtime / driver calls in the trace


def profile_batches(args: argparse.Namespace) -> list[int]:
    """The B of each profile window: --profile-batch, else min(16, the largest --decode-batch);
    the first is the one the issue's GPU-busy row reports."""
    return args.profile_batch or [min(16, max(args.decode_batch))]


# ---- the profiler window -------------------------------------------------------------------------
class ProfileWindow:
    """Profiles `num_steps` consecutive host turns once `skip` full decode steps (all `batch`
    requests feed one token) have run. Called by StepTimer.on_record on the stepping thread, so
    the profiler starts and stops between steps; `wall_s` spans the profiled turns and
    `records` are their steps (the report checks they were all full decode steps)."""

    def __init__(self, device: str, batch: int, skip: int, num_steps: int) -> None:
        self.device, self.batch, self.skip, self.num_steps = device, batch, skip, num_steps
        self.seen = 0
        self.records: list[StepRecord] = []
        self.prof: Any = None
        self.done = False
        self.result: dict[str, Any] = {}
        self.wall_s = 0.0
        self._start = 0.0

    def on_record(self, record: StepRecord) -> None:
        if self.done:
            return
        if self.prof is None:
            self.seen += record.decode and record.batch == self.batch
            if self.seen == self.skip:
                from torch.profiler import ProfilerActivity, profile

                # CUDA activity alone carries kernels and the runtime/driver launch calls; CPU
                # op recording would slow the profiled steps further.
                on_gpu = self.device == "cuda"
                activity = ProfilerActivity.CUDA if on_gpu else ProfilerActivity.CPU
                self.prof = profile(activities=[activity])
                self.prof.start()
                sync(self.device)
                self._start = time.perf_counter()
            return
        self.records.append(record)
        if len(self.records) == self.num_steps:
            sync(self.device)
            self.wall_s = time.perf_counter() - self._start
            self.prof.stop()
            # Read now: a later window's profiler session leaves this one's kernels without
            # durations (the H200 run of 2026-11-27 read 0 us for the first of two windows).
            self.result = self._summarize()
            self.done = True

    def summary(self) -> dict[str, Any]:
        """Kernel time (the union of kernel intervals: GPU busy; and their plain sum), kernels
        run and launch calls per profiled step, from the Chrome trace of the window."""
        if not self.done:
            raise RuntimeError(
                f"the profile window never closed: {self.seen} full decode steps at B="
                f"{self.batch} seen, {len(self.records)} of {self.num_steps} profiled"
            )
        return self.result

    def _summarize(self) -> dict[str, Any]:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "trace.json"
            self.prof.export_chrome_trace(str(path))
            events = json.loads(path.read_text()).get("traceEvents", [])
        spans = sorted(
            (float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0)))
            for e in events
            if e.get("cat") == "kernel"
        )
        busy_us, end = 0.0, float("-inf")
        for start, stop in spans:  # union: overlapping kernels of two streams count once
            busy_us += max(0.0, stop - max(start, end))
            end = max(end, stop)
        by_name: dict[str, float] = {}
        for e in events:
            if e.get("cat") == "kernel":
                name = str(e.get("name", "?"))
                by_name[name] = by_name.get(name, 0.0) + float(e.get("dur", 0.0))
        # cudaLaunchKernel(ExC), cuLaunchKernel(Ex) (Triton), cudaGraphLaunch, cuGraphLaunch.
        calls = [e.get("name", "") for e in events if e.get("cat") in API_CATEGORIES]
        n = len(self.records)
        return {
            "steps": n,
            "full_decode": sum(r.decode and r.batch == self.batch for r in self.records),
            "wall_s": self.wall_s,
            "step_s": [r.step_s for r in self.records],
            "kernels": len(spans) / n,
            "busy_s": busy_us / 1e6,
            "kernel_sum_s": sum(b - a for a, b in spans) / 1e6,
            "launches": sum("LaunchKernel" in name for name in calls) / n,
            "graph_launches": sum("GraphLaunch" in name for name in calls) / n,
            "api_calls": len(calls),  # 0 on the GPU: the trace lacks the runtime calls
            "events": len(events),
            "on_gpu": self.device == "cuda",
            # the kernels that took longest in all, us per step: where a step's GPU time goes
            "top_kernels": sorted(((us / n, k) for k, us in by_name.items()), reverse=True)[:8],
        }


# ---- omni ----------------------------------------------------------------------------------------
async def omni_pass(
    model_dir: str, tokenizer: Any, args: argparse.Namespace, mode: Mode
) -> dict[str, Any]:
    """mode: True graphs on, False off, "ahead" graphs on with engine.async_scheduling,
    "processes" that with the stage in a process of its own (no profile window there)."""
    overrides = decode_overrides(args)
    overrides["stages.llm.engine.cuda_graphs"] = mode is not False
    overrides["stages.llm.engine.async_scheduling"] = mode in ("ahead", "processes")
    if mode == "processes":
        overrides["runtime.backend"] = "processes"
    sync(args.device)
    t0 = time.perf_counter()
    async with AsyncOmni(model=model_dir, **overrides) as engine:
        startup_s = time.perf_counter() - t0
        stats = engine.stats()["llm"]
        if mode == "processes":
            levels = await timed_levels(engine, StageProcessTimer(engine), tokenizer, args)
            return {"startup_s": startup_s, "stats": stats, "levels": levels, "profiles": {}}
        host = cast(Any, engine._driver().backend).hosts["llm"]
        timer = StepTimer()
        timer.install(host)
        windows: dict[int, ProfileWindow] = {}
        try:
            levels = await timed_levels(engine, timer, tokenizer, args)
            for batch in profile_batches(args) if args.profile else []:
                window = windows[batch] = ProfileWindow(
                    args.device, batch, args.profile_skip, args.profile_steps
                )
                timer.on_record = window.on_record
                tokens = args.profile_skip + args.profile_steps + 3
                await decode_batch(engine, tokenizer, args, batch, 2, tokens)
                timer.on_record = None
                timer.take()
        finally:
            timer.uninstall()
            for window in windows.values():
                if window.prof is not None and not window.done:
                    window.prof.stop()  # the batch ended inside the window: summary() says so
        profiles = {batch: window.summary() for batch, window in windows.items()}
    release(args.device)
    return {"startup_s": startup_s, "stats": stats, "levels": levels, "profiles": profiles}


# ---- transformers --------------------------------------------------------------------------------
def load_hf_decoder(model_dir: str, device: str) -> Any:
    from transformers import AutoModelForCausalLM

    if device == "cuda":
        model = AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=torch.bfloat16, device_map="cuda"
        )
    else:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    config = model.generation_config
    config.pad_token_id = config.pad_token_id if config.pad_token_id is not None else 0
    config.eos_token_id = None  # exactly the budget, as omni's ignore_eos
    return model.eval()


def timed_generate(model: Any, ids: torch.Tensor, n: int, cache: str | None, device: str) -> float:
    """Seconds of one greedy generate of exactly n new tokens per row."""
    sync(device)
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=n,
            do_sample=False,
            cache_implementation=cache,
            disable_compile=device == "cpu",
        )
    sync(device)
    took = time.perf_counter() - start
    if out.shape[1] - ids.shape[1] != n:
        raise RuntimeError(f"generate made {out.shape[1] - ids.shape[1]} tokens, not {n}")
    return took


def hf_pass(
    model_dir: str, tokenizer: Any, args: argparse.Namespace, cache: str | None
) -> list[dict[str, Any]]:
    """cache: None (the dynamic cache) or "static"."""
    model = load_hf_decoder(model_dir, args.device)
    new = args.decode_tokens
    rows = []
    try:
        for batch in args.decode_batch:
            prompts = [
                random_ids(tokenizer, args.decode_prompt_tokens, (6, 1, batch, i))
                for i in range(batch)
            ]  # the prompts of omni's timed level at this B (gpu_decoder.decode_batch, key 1)
            ids = torch.tensor(prompts, device=args.device)

            generate = functools.partial(
                timed_generate, model, ids, cache=cache, device=args.device
            )
            warm_s = generate(new)  # compiles (static cache on a GPU)
            generate(1)
            # The best of two each: the difference of two timings doubles their noise.
            full_s = min(generate(new) for _ in range(2))
            prefill_s = min(generate(1) for _ in range(2))
            step_s = (full_s - prefill_s) / max(1, new - 1)
            rows.append(
                {
                    "batch": batch,
                    "warm_s": warm_s,
                    "full_s": full_s,
                    "prefill_s": prefill_s,
                    "step_s": step_s,
                }
            )
            print(
                f"  transformers {cache or 'dynamic'} B={batch}: {step_s * 1e3:.2f} ms/step "
                f"(first generate {warm_s:.1f} s)",
                flush=True,
            )
    finally:
        del model
        if cache == "static" and args.device == "cuda":
            torch._dynamo.reset()  # the compiled forward and its graphs hold the weights
        release(args.device)
    return rows


# ---- the part ------------------------------------------------------------------------------------
def decode_section(model_dir: str, tokenizer: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Every measurement of the part; one that fails is printed and left out (None), its name
    in "errors", and the others still run."""
    import asyncio

    out: dict[str, Any] = {"omni": {}, "hf": {}, "errors": []}
    if args.profile:
        # An empty profile here, on the main thread and before any graph of this part is
        # captured: libkineto initialises on its first use, and only on the thread that
        # registered torch's client; and graphs captured before the profiler's first use may
        # replay untraced (torch.profiler._utils._init_for_cuda_graphs does the same).
        from torch.profiler import ProfilerActivity, profile

        cuda = [ProfilerActivity.CUDA] if args.device == "cuda" else []
        with profile(activities=[ProfilerActivity.CPU, *cuda]):
            pass

    def attempt(name: str, fn: Any) -> Any:
        try:
            return fn()
        except Exception:
            traceback.print_exc()
            print(f"\n!! decode: {name} failed (traceback above); going on")
            out["errors"].append(name)
            return None
        finally:
            release(args.device)

    # Graphs first: its start-up is not flattered by warm caches.
    modes: tuple[Mode, ...] = tuple(
        m for m in (True, "ahead", "processes", False) if m not in args.skip
    )
    for mode in modes:
        label = f"omni {mode_label(mode)}"
        out["omni"][mode] = attempt(
            label, lambda m=mode: asyncio.run(omni_pass(model_dir, tokenizer, args, m))
        )
        if out["omni"][mode] is not None:
            print(f"  {label}: done", flush=True)
    for cache, skip in ((None, "hf-dynamic"), ("static", "hf-static")):
        if skip not in args.skip:
            name = cache or "dynamic"
            out["hf"][name] = attempt(
                f"transformers {name}", lambda c=cache: hf_pass(model_dir, tokenizer, args, c)
            )
    return out
