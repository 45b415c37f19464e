"""Decoder stages on a CUDA GPU: token-for-token equality with transformers in float32 on the same
GPU (prefix caching on and off, chunked prefill, tiny pools with eviction and preemption, a pool
sized from gpu_memory_utilization), bfloat16 agreement (printed), device stats, and output-cache
rows written by asynchronous device-to-host copies.

Every test needs a GPU (`cuda` marker: tests/conftest.py skips them where torch sees none). Run
them with `pytest -q tests/cuda -s` to see the printed bfloat16 agreement."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import make_engine, run_engine, shared_prefix_prompts
from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

from omni.config import ConfigError
from omni.core.sampling_params import SamplingParams
from omni.runtime.output_cache import OutputCache

pytestmark = [pytest.mark.cuda, pytest.mark.slow]

CUDA = torch.device("cuda", 0)
MAX_NEW = 16
GREEDY = SamplingParams(max_tokens=MAX_NEW, ignore_eos=True)
FP32 = {"device": "cuda", "dtype": "float32"}

CONFIGS = {
    "caching-on": {"block_size": 4, "num_blocks": 2048},
    "caching-off": {"block_size": 4, "num_blocks": 2048, "enable_prefix_caching": False},
    "chunked-prefill": {"block_size": 4, "num_blocks": 2048, "max_num_batched_tokens": 24},
    "tiny-pool": {"block_size": 4, "num_blocks": 48, "max_model_len": 192},
    "tiny-pool-chunked": {
        "block_size": 4,
        "num_blocks": 40,
        "max_num_batched_tokens": 16,
        "max_model_len": 160,
    },
    # num_blocks null: sized from gpu_memory_utilization after a profiled forward.
    "sized-from-gpu": {"block_size": 16, "gpu_memory_utilization": 0.2, "max_model_len": 512},
}


def hf_greedy(model_dir: str, prompts: list[list[int]], dtype: torch.dtype) -> list[list[int]]:
    """transformers' greedy generate on the GPU (sdpa), exactly MAX_NEW tokens each."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation="sdpa")
    model = model.to(CUDA).eval()
    model.generation_config.eos_token_id = None
    config = GenerationConfig(max_new_tokens=MAX_NEW, do_sample=False, pad_token_id=0)
    outputs = []
    with torch.inference_mode():
        for prompt in prompts:
            ids = torch.tensor([prompt], device=CUDA)
            out = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config)
            outputs.append(out[0, len(prompt) :].tolist())
    return outputs


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def family(request, qwen2_dir, llama_dir):
    model_dir = qwen2_dir if request.param == "qwen2" else llama_dir
    prompts = shared_prefix_prompts(AutoConfig.from_pretrained(model_dir).vocab_size)
    return request.param, model_dir, prompts, hf_greedy(model_dir, prompts, torch.float32)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_float32_tokens_equal_transformers_on_cuda(family, name):
    _, model_dir, prompts, expected = family
    engine = make_engine(model_dir, **FP32, **CONFIGS[name])
    assert all(t.device == CUDA for pair in engine.runner.kv_caches for t in pair)
    for round_ in ("a", "b"):  # the second round is served from the prefix cache where it is on
        results = run_engine(engine, prompts, GREEDY, prefix=round_)
        for index, (result, want) in enumerate(zip(results, expected, strict=True)):
            assert result.token_ids == want, f"{name}: prompt {index}, round {round_}"
            assert result.tensors["hidden_states"].device.type == "cpu"  # results leave on host
    stats = engine.stats()
    assert stats["device"] == "cuda:0" and stats["dtype"] == "float32"
    assert stats["memory_allocated_bytes"] > 0 and stats["memory_reserved_bytes"] > 0
    if name.startswith("tiny-pool"):
        assert stats["preemptions"] > 0 and stats["kv_evictions"] > 0, stats
    if name == "caching-off":
        assert stats["kv_hit_tokens"] == 0
    else:
        assert stats["kv_hit_tokens"] > 0
    if name == "sized-from-gpu":
        # Capped at max_num_seqs sequences of max_model_len, as on the CPU.
        assert stats["num_blocks"] == 32 * 512 // 16, stats


def test_a_pool_larger_than_the_gpu_is_a_config_error(qwen2_dir):
    """The GPU twin of tests/integration/test_cache_sizing.py: an explicit num_blocks is checked
    against the GPU memory free after the weights load, and the message says so."""
    with pytest.raises(ConfigError) as info:
        make_engine(qwen2_dir, device="cuda", num_blocks=1_000_000_000)
    message = str(info.value)
    assert message.startswith("stage 'llm': stages.llm.engine.num_blocks=1000000000 needs")
    assert "bytes of GPU memory" in message
    assert "bytes are free after loading the weights" in message


def test_bfloat16_agreement_is_reported(family):
    """bfloat16 (the GPU default, dtype null) against transformers in bfloat16 on the same GPU:
    rounding differs between the two attention implementations, so the share of equal tokens
    is printed rather than required to be 1."""
    name, model_dir, prompts, _ = family
    expected = hf_greedy(model_dir, prompts, torch.bfloat16)
    engine = make_engine(model_dir, device="cuda", block_size=4, num_blocks=2048)
    assert engine.stats()["dtype"] == "bfloat16"
    results = run_engine(engine, prompts, GREEDY)
    pairs = [
        (a, b)
        for r, want in zip(results, expected, strict=True)
        for a, b in zip(r.token_ids, want, strict=True)
    ]
    equal = sum(a == b for a, b in pairs) / len(pairs)
    first = sum(r.token_ids[0] == w[0] for r, w in zip(results, expected, strict=True))
    print(
        f"\n[bfloat16 {name}] equal tokens {equal:.1%} of {len(pairs)}; "
        f"first tokens equal {first}/{len(prompts)}"
    )
    assert len(pairs) == len(prompts) * MAX_NEW


@pytest.mark.parametrize("where", ["cpu", "cuda"])
def test_output_cache_rows_on_cuda_equal_transformers(qwen2_dir, where):
    """Hidden states through the host cache (asynchronous copies) or the GPU cache equal
    transformers' last hidden states, with prefix hits and a tiny pool."""
    model = AutoModelForCausalLM.from_pretrained(
        qwen2_dir, dtype=torch.float32, attn_implementation="sdpa"
    )
    model = model.to(CUDA).eval()
    prompts = shared_prefix_prompts(model.config.vocab_size, num_prompts=9, seed=3)
    engine = make_engine(
        qwen2_dir, **FP32, output_cache_device=where, block_size=4, num_blocks=40, max_model_len=128
    )
    cache = engine.output_cache
    assert cache.device.type == where
    if where == "cpu":
        assert cache.pinned_staging and cache._copies is not None
        assert cache._copies.stream is not None
        # Plain host memory: the copies land in pinned staging (output_cache.py says why).
        assert not any(c.is_pinned() for c in cache.caches.values())
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    for round_ in ("a", "b"):
        for result in run_engine(engine, prompts, params, prefix=round_):
            fed = result.prompt_token_ids + result.token_ids[:-1]
            with torch.inference_mode():
                ids = torch.tensor([fed], device=CUDA)
                ref = model(ids, output_hidden_states=True).hidden_states[-1][0].cpu()
            got = result.tensors["hidden_states"]
            assert got.device.type == "cpu" and got.shape == ref.shape
            assert float((got - ref).norm() / ref.norm()) < 1e-4
    stats = engine.stats()
    assert stats["output_hit_rows"] > 0 and stats["preemptions"] > 0
    assert stats["output_cache_device"] == str(cache.device)


def test_async_copies_survive_source_reuse():
    """Large rows produced on the main stream, written by side-stream copies, their memory freed
    and refilled with NaN right after: every row in the host cache is the one written."""
    rng = np.random.default_rng(0)
    num_blocks, block_size, dim = 512, 16, 1024
    cache = OutputCache(num_blocks, block_size, torch.float32, source_device=CUDA)
    cache.allocate("hidden_states", (dim,))
    assert cache.pinned_staging and not cache.caches["hidden_states"].is_pinned()
    reference = torch.zeros(num_blocks * block_size, dim)
    weight = torch.randn(dim, dim, device=CUDA) / dim**0.5
    for step in range(30):
        num = int(rng.integers(1, 4096))
        slots_np = np.sort(rng.choice(num_blocks * block_size, size=num, replace=False))
        rng.shuffle(slots_np[: num // 2])  # runs of every length, in no particular order
        slots = torch.from_numpy(slots_np.astype(np.int64))
        rows = torch.randn(num, dim, device=CUDA)
        for _ in range(8):  # keep the main stream busy so that the copies lag behind
            rows = torch.tanh(rows @ weight)
        cache.step = step + 1
        cache.write(slots, {"hidden_states": rows})
        reference[slots] = rows.cpu()  # syncs the main stream only
        del rows
        torch.full((num, dim), float("nan"), device=CUDA)  # reuses the freed block at once
    table = list(range(num_blocks))
    got = cache.gather(table, num_blocks * block_size, admitted_step=100)["hidden_states"]
    assert torch.equal(got, reference)
    window = cache.rows([5, 2, 9], 3, 40)["hidden_states"]
    slots = torch.tensor([5, 2, 9]).repeat_interleave(16) * 16 + torch.arange(16).repeat(3)
    assert torch.equal(window, reference[slots[3:40]])


def test_sampler_on_cuda_is_seeded_and_batch_independent():
    from omni.runtime.sampler import Sampler

    logits = torch.randn(6, 300, device=CUDA) * 3
    seeded = SamplingParams(temperature=1.0, seed=1234)
    alone = Sampler(device=CUDA)(logits[2:3], [seeded], [5])
    mixed = [SamplingParams(temperature=0.7), SamplingParams(), seeded] + [
        SamplingParams(temperature=1.0, top_k=5, top_p=0.9)
    ] * 3
    together = Sampler(seed=2, device=CUDA)(logits, mixed, [0, 1, 5, 2, 3, 4])
    assert together[2] == alone[0]
    assert together[1] == int(logits[1].argmax())
    assert all(isinstance(t, int) for t in together)


def test_sampler_groups_on_cuda_keep_a_seeded_row_batch_independent():
    """bf16 logits (many ties), a seeded row of each group (topk of 256 columns, the sorted
    vocabulary, the plain row) drawn alone and beside rows of the other groups: the same token;
    and top_k 1 takes a largest logit whatever the temperature."""
    from omni.runtime.sampler import TOP_K_CAP, Sampler

    generator = torch.Generator(device=CUDA).manual_seed(0)
    logits = (torch.randn(6, 5000, device=CUDA, generator=generator) * 3).bfloat16()
    seeded = [
        SamplingParams(temperature=0.9, top_k=40, top_p=0.9, seed=11),  # top
        SamplingParams(temperature=0.9, top_p=0.9, seed=12),  # sorted
        SamplingParams(temperature=0.9, top_k=TOP_K_CAP + 1, seed=13),  # sorted
        SamplingParams(temperature=0.9, seed=14),  # plain
    ]
    others = [SamplingParams(temperature=1.2, top_k=3), SamplingParams(temperature=0.5, top_p=0.5)]
    for n in range(8):
        alone = [Sampler(device=CUDA)(logits[i : i + 1], [p], [n])[0] for i, p in enumerate(seeded)]
        together = Sampler(seed=3, device=CUDA)(logits, [*seeded, *others], [n] * 4 + [0, 0])
        assert together[:4] == alone, n
    greedy = Sampler(device=CUDA)(logits, [SamplingParams(temperature=1.5, top_k=1)] * 6, [0] * 6)
    best = logits.max(dim=-1).values  # a tie at the max may go to either token
    assert all(logits[r, token] == best[r] for r, token in enumerate(greedy))


def test_penalties_on_cuda_count_what_the_cpu_counts():
    """OpenAI's penalties and the repetition penalty on the GPU (counts added to from device
    ids, no sync): the same penalized logits as on the CPU over a few steps, bf16 included."""
    from omni.runtime.output_penalties import OutputPenalties

    params = [
        SamplingParams(presence_penalty=1.0, frequency_penalty=0.5),
        SamplingParams(),
        SamplingParams(frequency_penalty=-2.0, repetition_penalty=1.3),
    ]
    ids = ["a", "b", "c"]
    logits = torch.randn(3, 1000, generator=torch.Generator().manual_seed(1)).bfloat16()
    got = {}
    for device in ("cpu", CUDA):
        penalties = OutputPenalties()
        penalties.note_prompt("c", [9, 4, 999])  # repetition: the prompt's tokens too
        for tokens in ([4, 1, 7], [4, 2, 7], [5, 3, 7]):
            penalties.apply(logits.to(device), ids, params)
            penalties.record(ids, params, torch.tensor(tokens, device=device))
        got[str(device)] = penalties.apply(logits.to(device), ids, params).cpu()
    assert got["cpu"].dtype == torch.float32 and torch.equal(got["cpu"], got[str(CUDA)])
