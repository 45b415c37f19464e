"""Paged attention as one Triton kernel: ragged prefill chunks (with or without a cached prefix)
and decode in one launch, block ids read from the block table inside the kernel.

Same layout and semantics as kernels/paged_attention.py (whose paged_attention_reference is the
oracle): query [num_tokens, H, D] packed ragged, sequence i owns rows query_start_loc[i]:[i + 1],
the LAST q_len_i positions of its context of seq_lens[i] tokens; K/V in caches
[num_blocks, block_size, Hkv, D] at the blocks of block_tables[i]; query head h reads kv head
h // (H // Hkv); causal within the context.

Design:
- One program per (query tile, kv head). A query tile is up to BLOCK_Q consecutive tokens of one
  sequence times the whole GQA group of the kv head: its rows are (token, head-in-group) pairs,
  so every key/value tile loaded is shared by the group (decode with group 8 has 8 useful rows).
- The tiles of all sequences are numbered consecutively; tile_starts (a cumsum over
  ceil(q_len / BLOCK_Q), computed with torch on the device) maps a program to its sequence by
  binary search. The grid is an upper bound known from the shapes alone,
  (num_tokens + num_seqs * (BLOCK_Q - 1)) // BLOCK_Q, so the launch needs no device-to-host sync;
  programs past the last tile do nothing.
- Keys are visited in tiles of BLOCK_N positions independent of the cache block size: each key
  position j looks up block_tables[seq, j // block_size], so any block size works and the dot
  shapes stay >= 16. Keys past the tile's last query position are never visited.
- Flash-style online softmax in float32 (exp2 with the scale folded into log2 units); q @ k and
  p @ v on tensor cores in the input dtype (float32 inputs use "ieee" precision, not tf32).
- head_dim need not be a power of two: it is padded to the next one and masked.
- Too few programs for the GPU: each also takes a split of its keys (kernels/split_kv.py).
"""

import torch

from kernels import split_kv
from kernels.triton_launch import HAVE_TRITON, launch, next_pow2, tl, triton

ROWS_PREFILL = 64  # query rows (tokens x group heads) per program when some chunk is long
ROWS_DECODE = 16  # rows per program when every sequence feeds one token (tl.dot needs >= 16)
# Key positions per inner step: 64, or 32 where a K/V tile row exceeds 256 bytes (float32 with
# head_dim 128, head_dim 256), which keeps K + V tiles at 64 KiB or less of shared memory.
BLOCK_N = 64
TILE_ROW_BYTES = 256


def _attention_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    out_ptr,
    part_out_ptr,
    part_lse_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    query_start_loc_ptr,
    tile_starts_ptr,
    num_seqs,
    num_tokens,
    num_splits,
    search_steps,
    scale_log2,
    stride_qt,
    stride_qh,
    stride_qd,
    stride_ot,
    stride_oh,
    stride_od,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_kd,
    stride_vb,
    stride_vs,
    stride_vh,
    stride_vd,
    stride_bt,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MIN_SHARE: tl.constexpr,
    FP32_DOT: tl.constexpr,
    PRECISION: tl.constexpr,
):
    tile = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    # Sequence of this tile: the largest s with tile_starts[s] <= tile (sequences without query
    # tokens have no tiles and are skipped since tile_starts is non-decreasing).
    lo = tile * 0
    hi = lo + num_seqs
    for _ in range(search_steps):
        mid = (lo + hi) // 2
        right = tl.load(tile_starts_ptr + mid) <= tile
        lo = tl.where(right, mid, lo)
        hi = tl.where(right, hi, mid)
    seq = lo
    q_begin = tl.load(query_start_loc_ptr + seq).to(tl.int32)
    q_len = tl.load(query_start_loc_ptr + seq + 1).to(tl.int32) - q_begin
    seq_len = tl.load(seq_lens_ptr + seq).to(tl.int32)
    tile_first = (tile - tl.load(tile_starts_ptr + seq)) * BLOCK_Q  # first query index in seq
    # Keys this tile needs: up to its last query's position (none for programs past the end);
    # this program's share of them: whole key tiles, at least MIN_SHARE keys (kernels/split_kv).
    tile_last = tl.minimum(tile_first + BLOCK_Q, q_len)
    kv_end = tl.where(tile_first < q_len, seq_len - q_len + tile_last, 0)
    share = tl.maximum(tl.cdiv(tl.cdiv(kv_end, BLOCK_N), num_splits) * BLOCK_N, MIN_SHARE)
    kv_begin = split * share
    kv_stop = tl.minimum(kv_begin + share, kv_end)

    rows = tl.arange(0, BLOCK_Q * GROUP_PAD)
    t = tile_first + rows // GROUP_PAD  # query index within the sequence
    g = rows % GROUP_PAD
    row_ok = (t < q_len) & (g < GROUP)
    # Absolute position of each row's query; rows past q_len see every key (no empty softmax).
    pos = seq_len - q_len + t
    token = (q_begin + t).to(tl.int64)
    head = kv_head * GROUP + g
    d = tl.arange(0, HEAD_DIM_PAD)
    d_ok = d < HEAD_DIM
    q_off = token[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :] * stride_qd
    q = tl.load(q_ptr + q_off, mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    if FP32_DOT:
        q = q.to(tl.float32)
    m_i = tl.full((BLOCK_Q * GROUP_PAD,), -1.0e30, dtype=tl.float32)
    l_i = tl.zeros((BLOCK_Q * GROUP_PAD,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_Q * GROUP_PAD, HEAD_DIM_PAD), dtype=tl.float32)
    table = block_tables_ptr + seq.to(tl.int64) * stride_bt
    kv_head_k = kv_head.to(tl.int64) * stride_kh
    kv_head_v = kv_head.to(tl.int64) * stride_vh
    cols = tl.arange(0, BLOCK_N)
    for start in range(kv_begin, kv_stop, BLOCK_N):
        j = start + cols
        j_ok = j < kv_stop
        block = tl.load(table + j // BLOCK_SIZE, mask=j_ok, other=0).to(tl.int64)
        offset = (j % BLOCK_SIZE).to(tl.int64)
        k_off = block * stride_kb + offset * stride_ks + kv_head_k
        k_ptrs = k_ptr + k_off[None, :] + d[:, None] * stride_kd  # [HEAD_DIM_PAD, BLOCK_N]
        k = tl.load(k_ptrs, mask=j_ok[None, :] & d_ok[:, None], other=0.0)
        v_off = block * stride_vb + offset * stride_vs + kv_head_v
        v_ptrs = v_ptr + v_off[:, None] + d[None, :] * stride_vd  # [BLOCK_N, HEAD_DIM_PAD]
        v = tl.load(v_ptrs, mask=j_ok[:, None] & d_ok[None, :], other=0.0)
        if FP32_DOT:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        s = tl.dot(q, k, input_precision=PRECISION) * scale_log2
        visible = (j[None, :] <= pos[:, None]) & j_ok[None, :]
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=PRECISION)
        m_i = m_new

    acc = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
    mask = row_ok[:, None] & d_ok[None, :]
    if num_splits == 1:
        o_off = token[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :] * stride_od
        tl.store(out_ptr + o_off, acc.to(out_ptr.dtype.element_ty), mask=mask)
    else:  # partials [num_splits, num_tokens, H, HEAD_DIM] and log2-sum-exp2s (empty: 0, -inf)
        part_row = (split * num_tokens + token) * (GROUP * tl.num_programs(1)) + head
        lse = tl.where(l_i > 0.0, m_i + tl.log2(tl.maximum(l_i, 1e-30)), float("-inf"))
        tl.store(part_lse_ptr + part_row, lse, mask=row_ok)
        tl.store(part_out_ptr + part_row[:, None] * HEAD_DIM + d[None, :], acc, mask=mask)


# Triton compiles a variant per specialization of its arguments: an integer equal to 1, or a
# multiple of 16; a pointer 16-byte aligned or not. Neither the host integers that vary with the
# batch nor the index tensors' addresses (views into a step's one upload, at offsets that
# follow its sizes) are specialized on: one binary per stage serves every step, every CUDA-graph
# bucket included, and no compile (hundreds of ms) happens under live traffic for a batch
# composition first seen then. The index loads are scalars: alignment buys them nothing.
NOT_SPECIALIZED = ("num_seqs", "num_tokens", "num_splits", "search_steps", "stride_bt")
NOT_SPECIALIZED_ON_ALIGNMENT = tuple(
    f"{name}_ptr" for name in ("block_tables", "seq_lens", "query_start_loc", "tile_starts")
)
if HAVE_TRITON:
    _kernel = triton.jit(
        _attention_kernel,
        do_not_specialize=list(NOT_SPECIALIZED),
        do_not_specialize_on_alignment=list(NOT_SPECIALIZED_ON_ALIGNMENT),
    )


def triton_paged_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    *,
    block_q: int | None = None,
    step_cache: dict | None = None,
    tile_starts: torch.Tensor | None = None,
    max_context: int | None = None,
    num_splits: int | None = None,
) -> torch.Tensor:
    """Causal attention of the packed queries against their paged contexts; returns
    [num_tokens, H, D] in the query dtype. No host sync. Index tensors may be int32 or int64 and
    may live on the host: they are then copied to the query's device on every call (keep them
    there once per step instead).

    block_q: query tokens per program (tests); by default chosen from the GQA group so that a
    program has ROWS_PREFILL rows, or ROWS_DECODE when the batch is pure decode.
    step_cache: a dict shared by the calls of one step (every layer: same metadata) that keeps
    the tile table derived from query_start_loc, so that only the first layer computes it.
    tile_starts: the tile table given by the caller ([num_seqs + 1] int32 on the device); for a
    pure decode batch (one query token per sequence) it is arange(num_seqs + 1) for any block_q,
    which a CUDA graph keeps in a static buffer instead of recomputing it in every replay.
    max_context, num_splits: see kernels/split_kv.py's `plan` (keys split over programs).
    """
    if not HAVE_TRITON:
        raise RuntimeError("triton_paged_attention needs the triton package")
    num_tokens, num_heads, head_dim = query.shape
    _, block_size, num_kv_heads, cache_head_dim = key_cache.shape
    num_seqs = seq_lens.shape[0]
    if value_cache.shape != key_cache.shape or cache_head_dim != head_dim:
        shapes = f"{tuple(key_cache.shape)}/{tuple(value_cache.shape)}"
        raise ValueError(f"caches {shapes} do not match query {tuple(query.shape)}")
    if num_heads % num_kv_heads:
        raise ValueError(f"{num_heads} query heads are not a multiple of {num_kv_heads} kv heads")
    if query_start_loc.shape != (num_seqs + 1,) or block_tables.shape[0] != num_seqs:
        got = f"{tuple(query_start_loc.shape)} and {tuple(block_tables.shape)}"
        raise ValueError(
            f"{num_seqs} seq_lens need {num_seqs + 1} query_start_loc entries and {num_seqs} "
            f"block_tables rows, got {got}"
        )
    if not (key_cache.dtype == value_cache.dtype == query.dtype):
        raise ValueError(f"dtypes differ: query {query.dtype}, caches {key_cache.dtype}")
    out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
    if num_tokens == 0 or num_seqs == 0:
        return out
    device = query.device
    group = num_heads // num_kv_heads
    group_pad = next_pow2(group)
    if block_q is None:
        rows = ROWS_DECODE if num_tokens <= num_seqs else ROWS_PREFILL
        block_q = max(1, rows // group_pad)
    block_q = next_pow2(block_q)
    head_dim_pad = max(16, next_pow2(head_dim))
    block_n = BLOCK_N if head_dim_pad * query.element_size() <= TILE_ROW_BYTES else BLOCK_N // 2
    index = (query_start_loc, seq_lens, block_tables)
    starts, lens, tables = (t.to(device, non_blocking=True) for t in index)
    # Per-sequence tile counts and their prefix sums, on the device (no sync).
    if tile_starts is None and step_cache is not None:
        tile_starts = step_cache.get(("tile_starts", block_q))
    if tile_starts is None:
        tiles = (starts[1:] - starts[:-1] + block_q - 1) // block_q
        tile_starts = torch.zeros(num_seqs + 1, dtype=torch.int32, device=device)
        tile_starts[1:] = torch.cumsum(tiles, 0)
        if step_cache is not None:
            step_cache[("tile_starts", block_q)] = tile_starts
    # Upper bound of sum(ceil(q_len / block_q)) from the shapes alone.
    num_tiles = (num_tokens + num_seqs * (block_q - 1)) // block_q
    num_splits, part_out, part_lse = split_kv.plan(
        num_tiles * num_kv_heads, max_context, query, step_cache, num_splits
    )
    # The interpreter (CPU tensors, or TRITON_INTERPRET=1) cannot multiply bf16: it stores them
    # as raw uint16. It then runs the dots in float32.
    interpret = device.type == "cpu" or not isinstance(_kernel, triton.runtime.jit.JITFunction)
    launch(
        _kernel,
        (num_tiles, num_kv_heads, num_splits),
        device,
        query,
        key_cache,
        value_cache,
        out,
        part_out,
        part_lse,
        tables,
        lens,
        starts,
        tile_starts,
        num_seqs,
        num_tokens,
        num_splits,
        max(1, (num_seqs - 1).bit_length()),  # binary search steps over tile_starts
        scale * 1.4426950408889634,  # log2(e): the kernel uses exp2
        *query.stride(),
        *out.stride(),
        *key_cache.stride(),
        *value_cache.stride(),
        tables.stride(0),
        BLOCK_SIZE=block_size,
        HEAD_DIM=head_dim,
        HEAD_DIM_PAD=head_dim_pad,
        GROUP=group,
        GROUP_PAD=group_pad,
        BLOCK_Q=block_q,
        BLOCK_N=block_n,
        MIN_SHARE=split_kv.MIN_SHARE,
        FP32_DOT=interpret,
        PRECISION="ieee" if query.dtype == torch.float32 or interpret else "tf32",
        num_warps=8 if head_dim_pad >= 256 else 4,
    )
    if num_splits > 1:
        split_kv.combine_splits(part_out, part_lse, out)
    return out
