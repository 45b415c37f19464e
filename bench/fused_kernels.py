"""Fused Triton kernels (omni/runtime/fused_layers.py) against transformers' own modules.

Run on a GPU:   PYTHONPATH=. python bench/fused_kernels.py [--batch 16] [--context 512]
CPU smoke test: PYTHONPATH=. python bench/fused_kernels.py --device cpu   (tiny layout, Triton's
interpreter: checks that everything runs and agrees; its timings mean nothing)

One Qwen2.5-0.5B-layout model (random bf16 weights, our paged-attention hook) is fed a decode
step: --batch sequences of --context cached tokens, one new token each, packed in one row. Timed
(torch.cuda.Event, mean of --iters after a warm-up), first with transformers' modules, then
after install_fused_kernels on the same weights:
- one decoder layer's forward, and the whole model forward (logits of every row included);
- each both eagerly (kernel launches from Python) and replayed from a CUDA graph captured
  once (what the engine's graphs will leave: kernel time only);
- kernels per layer and per step, counted with torch.profiler;
- agreement: greedy tokens of the step and the largest logit difference.
With --compile, a third variant: transformers' modules under `torch.compile` (inductor, default
mode; its compile time and graph breaks reported), the alternative issue 20 named for item 2,
timed the same ways. Ratios are unfused / fused from the same run. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
from bench_table import table
from gpu_checkpoints import QWEN2_0_5B

from omni.runtime.attention import AttentionMetadata, allocate_kv_caches, register_paged_attention
from omni.runtime.fused_layers import install_fused_kernels, uninstall_fused_kernels

TINY = dict(
    vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
)  # fmt: skip
BLOCK_SIZE = 16


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else None)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--batch", type=int, default=16, help="sequences decoding together")
    parser.add_argument("--context", type=int, default=512, help="cached tokens per sequence")
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--no-graph", action="store_true", help="skip the CUDA-graph timings")
    parser.add_argument(
        "--compile", action="store_true", help="also time transformers' modules under torch.compile"
    )
    return parser.parse_args()


def build(device: str, dtype: torch.dtype, batch: int, context: int) -> tuple[Any, dict]:
    """The model (random init on the device) and the step's inputs, with the paged KV cache of
    every sequence filled with noise (the attention reads real-looking values)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    layout = QWEN2_0_5B if device != "cpu" else TINY
    config = Qwen2Config(**layout, rope_theta=1e6)
    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = Qwen2ForCausalLM(config).eval()
    finally:
        torch.set_default_dtype(previous)
    model.set_attn_implementation(register_paged_attention())
    head_dim = config.hidden_size // config.num_attention_heads
    blocks_per_seq = -(-(context + 1) // BLOCK_SIZE)
    caches = allocate_kv_caches(
        config.num_hidden_layers, batch * blocks_per_seq, BLOCK_SIZE,
        config.num_key_value_heads, head_dim, dtype, device=device,
    )  # fmt: skip
    for key_cache, value_cache in caches:
        key_cache.normal_()
        value_cache.normal_()
    tables = torch.randperm(batch * blocks_per_seq).view(batch, blocks_per_seq)
    slots = [
        int(tables[i, context // BLOCK_SIZE]) * BLOCK_SIZE + context % BLOCK_SIZE
        for i in range(batch)
    ]
    meta = AttentionMetadata.build(
        slot_mapping=torch.tensor(slots),
        query_start_loc=torch.arange(batch + 1),
        seq_lens=torch.full((batch,), context + 1),
        block_tables=tables,
        kv_caches=caches,
        block_size=BLOCK_SIZE,
    )
    gen = torch.Generator().manual_seed(1)
    inputs = dict(
        input_ids=torch.randint(0, config.vocab_size, (1, batch), generator=gen).to(device),
        position_ids=torch.full((1, batch), context, device=device),
        use_cache=False,
        omni_attn=meta,
    )
    return model, inputs


def step_fns(model: Any, inputs: dict, wrap: Callable[[Any], Any] = lambda m: m) -> dict:
    """What is timed: one decoder layer (layer 0, the step's position embeddings computed once)
    and the whole model forward, each through `wrap` (torch.compile for that variant)."""
    hidden = model.model.embed_tokens(inputs["input_ids"])
    cos_sin = model.model.rotary_emb(hidden, inputs["position_ids"])
    layer, whole = wrap(model.model.layers[0]), wrap(model)
    kwargs = dict(position_ids=inputs["position_ids"], omni_attn=inputs["omni_attn"])

    def layer_step() -> Any:
        return layer(hidden, position_embeddings=cos_sin, use_cache=False, **kwargs)

    def model_step() -> Any:
        return whole(**inputs).logits

    return {"layer": layer_step, "model": model_step}


def time_eager(fn: Callable[[], Any], device: str, iters: int, warmup: int) -> float:
    """Mean ms per call, launched from Python."""
    for _ in range(warmup):
        fn()
    if device == "cpu":
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        return (time.perf_counter() - start) * 1e3 / iters
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    begin.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return begin.elapsed_time(end) / iters


def time_graph(fn: Callable[[], Any], iters: int, warmup: int) -> float:
    """Mean ms per replay of one CUDA graph of fn (captured after a warm-up on a side stream)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return time_eager(graph.replay, "cuda", iters, warmup)


def count_kernels(fn: Callable[[], Any]) -> int:
    """GPU kernels (and memcpy/memset) launched by one call, from torch.profiler."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == DeviceType.CUDA)


def measure(
    model: Any, inputs: dict, args: argparse.Namespace, wrap: Callable[[Any], Any] | None = None
) -> dict[str, Any]:
    """Every number of one variant (fused or not, compiled or not); a failing measurement is
    reported as n/a. wrap: applied to the layer and the model (torch.compile); its first calls
    (the compile) are timed apart."""
    results: dict[str, Any] = {}
    fns = step_fns(model, inputs, wrap) if wrap is not None else step_fns(model, inputs)
    with torch.no_grad():
        start = time.perf_counter()
        results["logits"] = fns["model"]().float()
        if wrap is not None:
            fns["layer"]()
            results["compile s"] = time.perf_counter() - start
        for name, fn in fns.items():
            results[f"{name} eager"] = time_eager(fn, args.device, args.iters, args.warmup)
            if args.device == "cpu":
                continue
            results[f"{name} kernels"] = count_kernels(fn)
            if not args.no_graph:
                try:
                    results[f"{name} graph"] = time_graph(fn, args.iters, args.warmup)
                except Exception as error:  # report and go on: the eager numbers still stand
                    results[f"{name} graph"] = f"n/a ({type(error).__name__}: {error})"[:80]
    return results


def cell(value: Any, unit: str = "") -> str:
    if isinstance(value, float):
        return f"{value:.3f}{unit}"
    return str(value)


def ratio(a: Any, b: Any) -> str:
    return f"{a / b:.2f}x" if isinstance(a, float | int) and isinstance(b, float | int) else "-"


def report(
    plain: dict[str, Any], fused: dict[str, Any], compiled: dict[str, Any] | None = None
) -> None:
    rows = []
    extra = [compiled] if compiled is not None else []
    for key in ("layer eager", "layer graph", "model eager", "model graph"):
        if key in plain:
            a, b = plain[key], fused.get(key)
            more = [cell(c.get(key, "-")) for c in extra]
            more += [ratio(c.get(key), b) for c in extra]
            rows.append([f"{key} (ms)", cell(a), cell(b), *more, ratio(a, b)])
    for key in ("layer kernels", "model kernels"):
        if key in plain:
            a, b = plain[key], fused[key]
            more = [str(c.get(key, "-")) for c in extra] + [ratio(c.get(key), b) for c in extra]
            rows.append([key, str(a), str(b), *more, ratio(a, max(b, 1))])
    header = ["per decode step", "transformers", "fused"]
    header += ["torch.compile", "compile / fused"] if compiled is not None else []
    table([*header, "transformers / fused"], rows)
    for name, other in (("fused", fused), ("torch.compile", compiled)):
        if other is None:
            continue
        want, got = plain["logits"][0], other["logits"][0]
        same = (want.argmax(-1) == got.argmax(-1)).float().mean().item()
        print(
            f"\n{name}: greedy tokens equal in {same:.0%} of {want.shape[0]} rows; largest "
            f"logit difference {(want - got).abs().max().item():.3g} (logits up to "
            f"{want.abs().max().item():.3g})"
        )
    if compiled is not None:
        print(
            f"torch.compile: {compiled['compile s']:.1f} s compiling the layer and the model, "
            f"{compiled['graph breaks']} graph breaks"
        )


def measure_compiled(model: Any, inputs: dict, args: argparse.Namespace) -> dict[str, Any] | None:
    """transformers' modules (fused forwards uninstalled) under torch.compile, or None with the
    reason printed when it cannot compile here."""
    import torch._dynamo

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    try:
        results = measure(model, inputs, args, wrap=torch.compile)
    except Exception as error:  # e.g. no C++ compiler for inductor on the CPU
        print(f"torch.compile: n/a ({type(error).__name__}: {str(error)[:200]})\n")
        return None
    results["graph breaks"] = sum(torch._dynamo.utils.counters["graph_break"].values())
    return results


def main() -> int:
    args = parse_args()
    if args.device is None:
        print(
            "bench/fused_kernels.py needs a CUDA GPU (or --device cpu for an interpreted smoke run)"
        )
        return 0
    if args.device == "cpu":
        args.iters, args.warmup, args.no_graph = 2, 1, True
        args.batch, args.context = min(args.batch, 4), min(args.context, 40)
        torch.set_num_threads(1)
    dtype = getattr(torch, args.dtype)
    model, inputs = build(args.device, dtype, args.batch, args.context)
    where = torch.cuda.get_device_name() if args.device != "cpu" else "CPU (Triton interpreter)"
    layout = "Qwen2.5-0.5B" if args.device != "cpu" else "tiny"
    print(
        f"{where}, torch {torch.__version__}: {layout} layout, {args.dtype}, decode step of "
        f"{args.batch} sequences x {args.context} cached tokens, mean of {args.iters}\n"
    )
    plain = measure(model, inputs, args)
    patched = install_fused_kernels(model, interpret_on_cpu=args.device == "cpu")
    print(f"install_fused_kernels: {patched} modules patched\n")
    fused = measure(model, inputs, args)
    uninstall_fused_kernels(model)
    compiled = measure_compiled(model, inputs, args) if args.compile else None
    report(plain, fused, compiled)
    return 0


if __name__ == "__main__":
    sys.exit(main())
