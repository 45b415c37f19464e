"""One stage-to-stage hop of per-token hidden states through Ray's object store, actor to actor.

The sender actor `ray.put`s a [rows, D] float32 tensor (put, timed in the sender); the receiver
actor gets the ObjectRef (nested in a list, so Ray does not resolve it for it) and turns it into a
torch tensor (get, timed in the receiver). Three encodings:

  torch pickled   the torch tensor itself: pickled into a byte string, unpickled (copied) again
  numpy view      omni.backends.transport.WireTensor, unpack(copy=False): zero-copy read-only view
  numpy + copy    omni.backends.transport.WireTensor, unpack(copy=True): what omni does (one memcpy)

hop = put + get; GB/s = bytes / hop. Best of --repeats hops (fresh objects each time): on a shared
machine the minimum is the least noisy estimate. Also the driver-side round trip of an empty
actor call (task latency). Timings vary with machine load: compare rows of one run only.

--pipeline: the data plane of a whole Qwen2.5-Omni pipeline on Ray (thinker -> talker ->
token2wav, the `bench` random-weight checkpoint unless --model), --prompt-tokens prompts, each
request alone: the tensor bytes per request that reached the driver, per stage (stats'
driver_tensor_bytes), and each hop's latency (the upstream finished -> the consumer's engine has
the request: routing, the fetch of the upstream result and the edge's input processor), median
of --requests. Twice: runtime.return_tensors=all (the old path: every stage's tensors fetched by
the driver) and final (only the caller's waveform comes to the driver).

    .venv/bin/python bench/pipeline_hop.py [--dim 896] [--rows 1024 4096 16384 32768]
    .venv/bin/python bench/pipeline_hop.py --pipeline [--prompt-tokens 1000] [--requests 5]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time

import ray

MODES = ("torch pickled", "numpy view", "numpy + copy")


@ray.remote(num_cpus=0.5)
class Sender:
    def put(self, rows: int, dim: int, mode: str) -> tuple[float, list]:
        import torch

        from omni.backends.transport import WireTensor

        tensor = torch.randn(rows, dim)
        payload = tensor if mode == "torch pickled" else WireTensor.pack(tensor)
        start = time.perf_counter()
        ref = ray.put(payload)
        return time.perf_counter() - start, [ref]


@ray.remote(num_cpus=0.5)
class Receiver:
    def get(self, refs: list, mode: str) -> tuple[float, float]:
        start = time.perf_counter()
        payload = ray.get(refs[0])
        tensor = payload if mode == "torch pickled" else payload.unpack(copy=mode == "numpy + copy")
        elapsed = time.perf_counter() - start
        return elapsed, float(tensor[-1, -1])  # touch the data

    def ping(self, refs: list) -> int:
        return len(refs)


def pipeline(args: argparse.Namespace) -> None:
    import random

    from omni import Omni
    from omni.core.sampling_params import SamplingParams
    from tools.make_tiny_checkpoint import ensure_checkpoint

    model = args.model or str(ensure_checkpoint("qwen2_5_omni", "bench"))
    stages = ("thinker", "talker", "token2wav")
    params = [
        SamplingParams(max_tokens=8, ignore_eos=True),
        SamplingParams(max_tokens=16, ignore_eos=True),
        SamplingParams(max_tokens=1, seed=0),
    ]
    cpu = {f"stages.{s}.engine.device": "cpu" for s in stages}
    rng = random.Random(0)
    print(f"Qwen2.5-Omni layout ({model}), {args.prompt_tokens}-token prompts, on Ray")
    print(f"{'return_tensors':<15}" + "".join(f"{s + ' B/req':>16}" for s in stages), end="")
    print(f"{'thinker->talker ms':>20}{'talker->token2wav ms':>22}")
    for mode in ("all", "final"):
        runtime = {"backend": "ray", "num_cpus": 2, "return_tensors": mode}
        with Omni(model=model, runtime=runtime, **cpu) as omni:
            before = {s: omni.stats()[s]["driver_tensor_bytes"] for s in stages}
            hops: list[tuple[float, float]] = []
            for _ in range(args.requests):  # 3..2000: token ids of the text vocabulary
                ids = [rng.randrange(3, 2000) for _ in range(args.prompt_tokens)]
                (out,) = omni.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)
                assert out.error is None, out.error
                t = {s: out.stages[s].timings for s in stages}

                def arrival(s: str, t: dict = t) -> float:
                    return t[s]["finished_s"] - t[s]["latency_s"]

                hops.append(
                    (
                        arrival("talker") - t["thinker"]["finished_s"],
                        arrival("token2wav") - t["talker"]["finished_s"],
                    )
                )
            after = {s: omni.stats()[s]["driver_tensor_bytes"] for s in stages}
        per = [(after[s] - before[s]) / args.requests for s in stages]
        first, second = (statistics.median(h[i] for h in hops) * 1e3 for i in (0, 1))
        print(f"{mode:<15}" + "".join(f"{b:>16,.0f}" for b in per), end="")
        print(f"{first:>20.1f}{second:>22.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dim", type=int, default=896)
    parser.add_argument("--rows", type=int, nargs="+", default=[1024, 4096, 16384, 32768])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--pipeline", action="store_true", help="the whole pipeline's data plane")
    parser.add_argument("--prompt-tokens", type=int, default=1000)
    parser.add_argument("--requests", type=int, default=5)
    parser.add_argument("--model", default=None, help="a Qwen2.5-Omni checkpoint directory")
    args = parser.parse_args()
    if args.pipeline:
        pipeline(args)
        return

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    temp_dir = tempfile.mkdtemp(prefix="omni-bench-", dir="/tmp")
    ray.init(num_cpus=2, include_dashboard=False, _temp_dir=temp_dir, logging_level="WARNING")
    try:
        sender, receiver = Sender.remote(), Receiver.remote()
        ray.get([receiver.ping.remote([]), sender.put.remote(1, 1, "numpy view")], timeout=120)
        rtt = []
        for _ in range(20):
            start = time.perf_counter()
            ray.get(receiver.ping.remote([]), timeout=60)
            rtt.append(time.perf_counter() - start)
        print(f"empty actor call round trip: {statistics.median(rtt) * 1e3:.2f} ms (median of 20)")
        print(f"hidden states [rows, {args.dim}] float32, best of {args.repeats} hops\n")
        header = f"{'rows':>6} {'MB':>7}  {'encoding':<14} {'put ms':>8} {'get ms':>8} "
        print(header + f"{'hop ms':>8} {'GB/s':>6}")
        for rows in args.rows:
            mb = rows * args.dim * 4 / 1e6
            for mode in MODES:
                puts, gets = [], []
                for _ in range(args.repeats):
                    put_s, refs = ray.get(sender.put.remote(rows, args.dim, mode), timeout=120)
                    get_s, _ = ray.get(receiver.get.remote(refs, mode), timeout=120)
                    puts.append(put_s)
                    gets.append(get_s)
                    del refs  # frees the object before the next one
                put, get = min(puts), min(gets)
                print(
                    f"{rows:>6} {mb:>7.1f}  {mode:<14} {put * 1e3:>8.2f} {get * 1e3:>8.2f} "
                    f"{(put + get) * 1e3:>8.2f} {mb / 1e3 / (put + get):>6.2f}"
                )
    finally:
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
