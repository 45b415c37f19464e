"""The Triton paged-attention kernel against the torch reference (kernels/paged_attention.py).

Without a GPU every case runs under Triton's interpreter on CPU tensors (numpy, float32 dots),
and a compile-only test builds the GPU binary for sm_90, which catches what the interpreter lets
through (dot shapes, types). With a GPU the same cases run the compiled kernel, and the `cuda`
tests add bfloat16 against the float32 oracle and the hook on CUDA caches.
"""

import random

import pytest
import torch

triton = pytest.importorskip("triton")

from kernels.paged_attention import paged_attention_reference  # noqa: E402
from kernels.triton_paged_attention import triton_paged_attention  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# The interpreter's CPU path leans on Triton internals of the pinned versions (see the kernel's
# _interpreted); a GPU machine may carry the triton of another torch, and runs compiled anyway.
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
cpu_only = pytest.mark.skipif(DEVICE == "cuda", reason="interpreter test; the GPU runs compiled")

# (q_len, seq_len) per sequence: queries are the last q_len positions of the context.
PREFILL = [(9, 9), (1, 1), (23, 23)]  # nothing cached
CHUNKS = [(7, 20), (5, 29), (12, 13)]  # cached prefixes of 13, 24, 1: not block-aligned
DECODE = [(1, 1), (1, 17), (1, 70), (1, 8)]
MIXED = [(6, 6), (1, 40), (11, 19), (1, 3), (4, 33)]
BATCHES = {
    "prefill": PREFILL,
    "chunks": CHUNKS,
    "decode": DECODE,
    "mixed": MIXED,
    "empty_query": [(3, 10), (0, 7), (1, 5), (0, 0)],  # sequences without query tokens
    "long": [(90, 150), (1, 140), (70, 70)],  # several query tiles and key tiles
}


def make_batch(specs, block_size, num_heads, num_kv_heads, head_dim, dtype, seed, device="cpu"):
    """Random caches with each sequence's K/V in shuffled blocks; every slot no sequence owns,
    and every unused block-table entry (-1), is poison: the kernel must never read them."""
    gen = torch.Generator().manual_seed(seed)
    blocks_per_seq = [-(-seq_len // block_size) for _, seq_len in specs]
    num_blocks = sum(blocks_per_seq) + 3
    ids = torch.randperm(num_blocks, generator=gen).tolist()
    width = max(blocks_per_seq + [1]) + 2
    block_tables = torch.full((len(specs), width), -1, dtype=torch.int64)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    key_cache = torch.full(shape, float("nan"))
    value_cache = torch.full(shape, float("nan"))
    for i, (_, seq_len) in enumerate(specs):
        own = [ids.pop() for _ in range(blocks_per_seq[i])]
        block_tables[i, : len(own)] = torch.tensor(own, dtype=torch.int64)
        for pos in range(seq_len):
            block, offset = own[pos // block_size], pos % block_size
            key_cache[block, offset] = torch.randn(num_kv_heads, head_dim, generator=gen)
            value_cache[block, offset] = torch.randn(num_kv_heads, head_dim, generator=gen)
    q_lens = torch.tensor([q for q, _ in specs], dtype=torch.int64)
    query_start_loc = torch.zeros(len(specs) + 1, dtype=torch.int64)
    query_start_loc[1:] = torch.cumsum(q_lens, 0)
    seq_lens = torch.tensor([s for _, s in specs], dtype=torch.int64)
    query = torch.randn(int(query_start_loc[-1]), num_heads, head_dim, generator=gen)
    tensors = dict(
        query=query,
        key_cache=key_cache,
        value_cache=value_cache,
        block_tables=block_tables,
        seq_lens=seq_lens,
        query_start_loc=query_start_loc,
    )
    for name in ("query", "key_cache", "value_cache"):
        tensors[name] = tensors[name].to(dtype)
    # The oracle (float64 inside) sees the same rounded inputs as the kernel.
    upcast = {k: v.float() if v.is_floating_point() else v for k, v in tensors.items()}
    reference = paged_attention_reference(scale=head_dim**-0.5, **upcast)
    return {k: v.to(device) for k, v in tensors.items()}, reference


def check(specs, *, block_size=16, heads=(4, 2), head_dim=64, dtype=torch.float32, seed=0, **kw):
    num_heads, num_kv_heads = heads
    tensors, reference = make_batch(
        specs, block_size, num_heads, num_kv_heads, head_dim, dtype, seed, kw.pop("device", DEVICE)
    )
    out = triton_paged_attention(scale=head_dim**-0.5, **tensors, **kw)
    assert out.shape == reference.shape and out.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.float().cpu(), reference, atol=tol, rtol=tol)


@pytest.mark.parametrize("batch", sorted(BATCHES))
def test_batches(batch):
    check(BATCHES[batch])


@pytest.mark.parametrize("block_size", [8, 16, 32, 1, 12])
def test_block_sizes(block_size):
    check(MIXED, block_size=block_size)


@pytest.mark.parametrize("heads", [(2, 2), (4, 2), (8, 2), (6, 2), (8, 1), (14, 2)])
def test_gqa(heads):
    """Group 1, 2, 4, 3 (padded to 4), 8 (all heads on one kv head), 7 (Qwen2.5-7B's 28/4)."""
    check(MIXED, heads=heads)


@pytest.mark.parametrize("head_dim", [64, 128, 80, 32, 8])
def test_head_dims(head_dim):
    check(MIXED, head_dim=head_dim)


@pytest.mark.parametrize("block_q", [1, 2, 4, 16, 64])
def test_query_tiles(block_q):
    """Tiles that split chunks at every boundary, up to one tile per sequence."""
    check(MIXED, block_q=block_q)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision(dtype):
    check(MIXED, dtype=dtype, heads=(8, 2))


@pytest.mark.parametrize("seed", range(4))
def test_random_batches(seed):
    rng = random.Random(seed)
    specs = []
    for _ in range(rng.randint(1, 6)):
        kind = rng.choice(["prefill", "chunk", "decode"])
        seq_len = rng.randint(1, 60)
        q_len = {"prefill": seq_len, "chunk": rng.randint(1, seq_len), "decode": 1}[kind]
        specs.append((q_len, seq_len))
    check(
        specs,
        block_size=rng.choice([8, 16, 32]),
        heads=rng.choice([(4, 4), (4, 2), (8, 2), (12, 4)]),
        head_dim=rng.choice([32, 64, 80]),
        seed=seed,
    )


def test_strided_query_as_the_hook_passes_it():
    """The hook hands query[0].transpose(0, 1) of [1, H, T, D]: a non-contiguous view."""
    tensors, reference = make_batch(MIXED, 16, 4, 2, 64, torch.float32, 0, DEVICE)
    tensors["query"] = tensors["query"].transpose(0, 1).contiguous().transpose(0, 1)
    assert not tensors["query"].is_contiguous()
    out = triton_paged_attention(scale=64**-0.5, **tensors)
    torch.testing.assert_close(out.cpu(), reference, atol=1e-5, rtol=1e-5)


def test_int32_and_host_metadata():
    """int32 index tensors, left on the host even when the data is on the GPU."""
    tensors, reference = make_batch(MIXED, 16, 4, 2, 64, torch.float32, 0, DEVICE)
    for name in ("block_tables", "seq_lens", "query_start_loc"):
        tensors[name] = tensors[name].to(device="cpu", dtype=torch.int32)
    out = triton_paged_attention(scale=64**-0.5, **tensors)
    torch.testing.assert_close(out.cpu(), reference, atol=1e-5, rtol=1e-5)


def test_no_tokens_and_bad_shapes():
    tensors, _ = make_batch([(0, 5)], 16, 4, 2, 64, torch.float32, 0)
    assert triton_paged_attention(scale=1.0, **tensors).shape == (0, 4, 64)
    tensors, _ = make_batch(MIXED, 16, 4, 2, 64, torch.float32, 0)
    with pytest.raises(ValueError, match="multiple"):
        triton_paged_attention(scale=1.0, **{**tensors, "query": torch.zeros(28, 3, 64)})
    tensors["query_start_loc"] = tensors["query_start_loc"][:-1]
    with pytest.raises(ValueError, match="query_start_loc"):
        triton_paged_attention(scale=1.0, **tensors)


@cpu_only
def test_compiles_for_sm90_without_a_gpu():
    """The real compiler (Triton IR -> PTX -> cubin with the wheel's ptxas) for an H100, bf16,
    group 7, head_dim 80: the interpreter checks neither dot shapes nor types. An interpreted
    launch first: it must leave triton.language as it found it."""
    import inspect

    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from kernels import triton_paged_attention as tpa

    check(DECODE)
    names = list(inspect.signature(tpa._attention_kernel).parameters)
    pointers = {"q_ptr": "*bf16", "k_ptr": "*bf16", "v_ptr": "*bf16", "out_ptr": "*bf16"}
    constexprs = dict(
        BLOCK_SIZE=16,
        HEAD_DIM=80,
        HEAD_DIM_PAD=128,
        GROUP=7,
        GROUP_PAD=8,
        BLOCK_Q=8,
        BLOCK_N=64,
        MIN_SHARE=256,
        FP32_DOT=False,
        PRECISION="tf32",
    )
    signature = {}
    for name in names:
        if name in constexprs:
            signature[name] = "constexpr"
        elif name in pointers:
            signature[name] = pointers[name]
        elif name.startswith("part_"):
            signature[name] = "*fp32"
        elif name == "block_tables_ptr":
            signature[name] = "*i64"
        elif name.endswith("_ptr"):
            signature[name] = "*i32"
        else:
            signature[name] = "fp32" if name == "scale_log2" else "i32"
    source = ASTSource(
        tpa._kernel, signature, constexprs={(names.index(k),): v for k, v in constexprs.items()}
    )
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    assert compiled.asm["cubin"]


@pytest.mark.cuda
@pytest.mark.parametrize("heads", [(4, 4), (8, 2), (28, 4)])
@pytest.mark.parametrize("batch", ["mixed", "decode", "long"])
def test_cuda_bf16_against_float32_reference(batch, heads):
    check(BATCHES[batch], heads=heads, head_dim=128, dtype=torch.bfloat16, device="cuda")


@pytest.mark.cuda
@pytest.mark.parametrize("block_size", [8, 16, 32])
def test_cuda_float32(block_size):
    """float32 on the GPU uses "ieee" dots (no tf32): as tight as on the CPU."""
    check(MIXED, block_size=block_size, heads=(8, 2), device="cuda")


def _hook_step(device, dtype):
    """Two layers of the registered hook over one mixed step: writes K/V, then attends."""
    from types import SimpleNamespace

    from omni.runtime.attention import (
        AttentionMetadata,
        allocate_kv_caches,
        paged_attention_forward,
    )

    gen = torch.Generator().manual_seed(0)
    specs, block_size, num_heads, num_kv_heads, head_dim = MIXED, 8, 8, 2, 64
    caches = allocate_kv_caches(2, 40, block_size, num_kv_heads, head_dim, dtype, device=device)
    for key_cache, value_cache in caches:  # the cached prefixes
        key_cache.copy_(torch.randn(key_cache.shape, generator=gen))
        value_cache.copy_(torch.randn(value_cache.shape, generator=gen))
    tables = torch.randperm(40, generator=gen)[: len(specs) * 5].view(len(specs), 5)
    slots, starts = [], [0]
    for i, (q_len, seq_len) in enumerate(specs):
        for pos in range(seq_len - q_len, seq_len):
            slots.append(int(tables[i, pos // block_size]) * block_size + pos % block_size)
        starts.append(starts[-1] + q_len)
    meta = AttentionMetadata.build(
        slot_mapping=torch.tensor(slots),
        query_start_loc=torch.tensor(starts),
        seq_lens=torch.tensor([s for _, s in specs]),
        block_tables=tables,
        kv_caches=caches,
        block_size=block_size,
    )
    outs = []
    for layer in range(2):
        query = torch.randn(1, num_heads, starts[-1], head_dim, generator=gen)
        key = torch.randn(1, num_kv_heads, starts[-1], head_dim, generator=gen)
        value = torch.randn(1, num_kv_heads, starts[-1], head_dim, generator=gen)
        query, key, value = (t.to(device=device, dtype=dtype) for t in (query, key, value))
        module = SimpleNamespace(layer_idx=layer)
        out, _ = paged_attention_forward(module, query, key, value, None, omni_attn=meta)
        outs.append(out.float().cpu())
    return meta, torch.stack(outs)


@cpu_only
def test_hook_dispatches_to_the_kernel(monkeypatch):
    """The hook's Triton path (forced on the CPU, interpreted) against its torch path: no plan
    is built, the strided query and the cache writes go through unchanged."""
    from omni.runtime import attention

    meta_cpu, expected = _hook_step("cpu", torch.float32)
    assert meta_cpu.plan is not None
    monkeypatch.setattr(attention, "uses_triton", lambda device: True)
    meta, got = _hook_step("cpu", torch.float32)
    assert meta.plan is None and meta.max_seq_len == 40
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.cuda
def test_cuda_hook_uses_the_kernel():
    meta_cpu, expected = _hook_step("cpu", torch.float32)
    meta, got = _hook_step("cuda", torch.float32)
    assert meta.plan is None and meta.block_tables.is_cuda and meta.slot_mapping.is_cuda
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    _, got_bf16 = _hook_step("cuda", torch.bfloat16)
    torch.testing.assert_close(got_bf16, expected, atol=3e-2, rtol=3e-2)
