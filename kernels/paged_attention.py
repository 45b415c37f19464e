"""Paged attention over a packed ragged batch, in pure torch (CPU first).

Layout: query [num_tokens, num_heads, head_dim]; sequence i owns query rows
query_start_loc[i]:query_start_loc[i+1], which are the LAST q_len_i positions of its context of
seq_lens[i] tokens whose K/V already sit in the caches [num_blocks, block_size, num_kv_heads,
head_dim] at the blocks listed in block_tables[i]. Query head h reads kv head h // group.

Two variants share one plan, built once per model step by make_plan and reused by every layer:
- single: one sequence alone; gather its blocks, one SDPA call: is_causal when nothing is cached,
  else an explicit bottom-right causal mask, or for long chunks a split into "cached prefix, no
  mask" + "new tokens, is_causal" merged by log-sum-exp (skips the masked half of the work).
- padded: several sequences in one call; gather their blocks into [S, max_len, Hkv, D] and mask
  padding + causality. Decode rows (q_len 1) fold the GQA group into the query axis, so keys are
  never repeated per head.
make_plan picks the variant per sequence; bench/paged_attention.py holds the measurements.
"""

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

# Returns (output, logsumexp); the public SDPA does not expose the log-sum-exp needed to merge.
try:
    _FLASH_CPU = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
except (AttributeError, RuntimeError):  # pragma: no cover - depends on the torch build
    _FLASH_CPU = None

SPLIT_MIN_Q = 256  # below this the split's second kernel call costs more than the mask saves
PADDED_MAX_Q = 16  # prefill chunks up to this many queries may share a padded call
STRATEGIES = ("auto", "loop", "padded")


@dataclass(eq=False)
class _Single:
    q_start: int
    q_end: int
    seq_len: int
    block_ids: torch.Tensor  # [ceil(seq_len / block_size)]
    mode: str  # "decode" (q_len 1, sees all) | "causal" (nothing cached) | "split" | "mask"
    mask: torch.Tensor | None = None  # bool [q_len, seq_len] (True = visible) for "mask"
    masks: dict = field(default_factory=dict)  # additive float masks by dtype, built lazily


@dataclass(eq=False)
class _Padded:
    token_ids: torch.Tensor  # [num_group_tokens] query rows owned by the group, padded order
    dest: torch.Tensor | None  # row of each token in the [S * max_q] padded layout (max_q > 1)
    block_ids: torch.Tensor  # [S * max_blocks], padding entries are any valid block id
    num_seqs: int
    max_q: int
    max_len: int
    mask: torch.Tensor | None  # bool [S, 1, max_q, max_len]; None when no row needs masking
    identity: bool  # token_ids == arange(num_tokens): no gather/scatter of query rows needed
    masks: dict = field(default_factory=dict)


@dataclass(eq=False)
class PagedAttentionPlan:
    """Everything shape-dependent about one step's batch; valid for every layer of that step."""

    block_size: int
    num_tokens: int
    max_seq_len: int
    singles: list[_Single]
    groups: list[_Padded]


def _additive(work: _Single | _Padded, dtype: torch.dtype) -> torch.Tensor | None:
    """The bool mask as 0/-inf in the query dtype, converted once per plan (SDPA needs it so)."""
    if work.mask is None:
        return None
    mask = work.masks.get(dtype)
    if mask is None:
        mask = torch.zeros(work.mask.shape, dtype=dtype).masked_fill_(~work.mask, float("-inf"))
        work.masks[dtype] = mask
    return mask


def _causal_mask(q_lens: torch.Tensor, seq_lens: torch.Tensor, max_q: int, max_len: int):
    """bool [S, max_q, max_len]: row t of sequence s sees key j iff j <= seq_len - q_len + t and
    j < seq_len. Padded rows (t >= q_len) see the whole context, so no row is fully masked."""
    rows = torch.arange(max_q).view(1, -1, 1)
    cols = torch.arange(max_len).view(1, 1, -1)
    last_visible = (seq_lens - q_lens).view(-1, 1, 1) + rows
    return (cols <= last_visible) & (cols < seq_lens.view(-1, 1, 1))


def _make_group(seq_ids, starts, lens, block_tables, block_size, num_tokens) -> _Padded:
    q_lens = torch.tensor([starts[i + 1] - starts[i] for i in seq_ids])
    ctx_lens = torch.tensor([lens[i] for i in seq_ids])
    max_q, max_len = int(q_lens.max()), int(ctx_lens.max())
    num_blocks = -(-max_len // block_size)
    token_ids = torch.cat([torch.arange(starts[i], starts[i + 1]) for i in seq_ids])
    dest = None
    if max_q > 1:
        dest = torch.cat([s * max_q + torch.arange(q) for s, q in enumerate(q_lens.tolist())])
    mask = _causal_mask(q_lens, ctx_lens, max_q, max_len).unsqueeze(1)
    if max_q == 1 and bool(mask.all()):
        mask = None  # equal lengths, one query each: every key is visible
    return _Padded(
        token_ids=token_ids,
        dest=dest,
        block_ids=block_tables[seq_ids, :num_blocks].reshape(-1).contiguous(),
        num_seqs=len(seq_ids),
        max_q=max_q,
        max_len=max_len,
        mask=mask,
        identity=len(token_ids) == num_tokens and bool((token_ids == torch.arange(num_tokens)).all()),
    )


def _make_single(i, starts, lens, block_tables, block_size) -> _Single:
    q_start, q_end, seq_len = starts[i], starts[i + 1], lens[i]
    q_len = q_end - q_start
    mask = None
    if q_len == 1:
        mode = "decode"
    elif q_len == seq_len:
        mode = "causal"
    elif q_len >= SPLIT_MIN_Q and _FLASH_CPU is not None:
        mode = "split"
    else:
        mode = "mask"
        mask = _causal_mask(torch.tensor([q_len]), torch.tensor([seq_len]), q_len, seq_len)[0]
    block_ids = block_tables[i, : -(-seq_len // block_size)].contiguous()
    return _Single(q_start, q_end, seq_len, block_ids, mode, mask)


def make_plan(
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    block_size: int,
    *,
    strategy: str = "auto",
) -> PagedAttentionPlan:
    """Precompute gather indices, masks and the single/padded split for one step.

    strategy: "auto" (measured best), or "loop"/"padded" to force one variant (bench, tests).
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
    lens, starts = seq_lens.tolist(), query_start_loc.tolist()
    num_seqs = len(lens)
    if len(starts) != num_seqs + 1 or block_tables.shape[0] != num_seqs:
        raise ValueError(f"{num_seqs} seq_lens need {num_seqs + 1} query_start_loc entries and "
                         f"{num_seqs} block_tables rows, got {len(starts)} and {block_tables.shape[0]}")
    for i in range(num_seqs):
        q_len = starts[i + 1] - starts[i]
        if not 0 <= q_len <= lens[i] or -(-lens[i] // block_size) > block_tables.shape[1]:
            raise ValueError(f"sequence {i}: q_len={q_len}, seq_len={lens[i]}, block_size="
                             f"{block_size}, block table width={block_tables.shape[1]}")
    block_tables = block_tables.to(torch.int64)
    decode_ids, short_ids, single_ids = [], [], []
    for i in range(num_seqs):
        q_len = starts[i + 1] - starts[i]
        if q_len == 0:
            continue
        if strategy == "loop":
            single_ids.append(i)
        elif q_len == 1:
            decode_ids.append(i)
        elif strategy == "padded" or q_len <= PADDED_MAX_Q:
            short_ids.append(i)
        else:
            single_ids.append(i)
    if strategy == "auto" and len(short_ids) == 1:
        single_ids += short_ids  # a padded group of one only adds padding work
        short_ids = []
    num_tokens = starts[-1] - starts[0]
    groups = [
        _make_group(ids, starts, lens, block_tables, block_size, num_tokens)
        for ids in (decode_ids, short_ids)
        if ids
    ]
    singles = [_make_single(i, starts, lens, block_tables, block_size) for i in single_ids]
    return PagedAttentionPlan(block_size, num_tokens, max(lens, default=0), singles, groups)


def _attend_padded(query, key_cache, value_cache, g: _Padded, scale) -> torch.Tensor:
    """Attention of one padded group; returns [num_group_tokens, num_heads, head_dim]."""
    num_heads, head_dim = query.shape[1:]
    num_kv_heads = key_cache.shape[2]
    shape = (g.num_seqs, -1, num_kv_heads, head_dim)
    keys = key_cache.index_select(0, g.block_ids).view(shape)[:, : g.max_len].transpose(1, 2)
    values = value_cache.index_select(0, g.block_ids).view(shape)[:, : g.max_len].transpose(1, 2)
    rows = query if g.identity else query.index_select(0, g.token_ids)
    mask = _additive(g, query.dtype)
    if g.max_q == 1:
        # Fold the GQA group into the query axis: [S, Hkv, group, D] against [S, Hkv, L, D].
        q = rows.reshape(g.num_seqs, num_kv_heads, num_heads // num_kv_heads, head_dim)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=scale)
        return out.reshape(g.num_seqs, num_heads, head_dim)
    padded = rows.new_zeros(g.num_seqs * g.max_q, num_heads, head_dim)
    padded.index_copy_(0, g.dest, rows)
    q = padded.view(g.num_seqs, g.max_q, num_heads, head_dim).transpose(1, 2)
    out = F.scaled_dot_product_attention(
        q, keys, values, attn_mask=mask, scale=scale, enable_gqa=True
    )
    return out.transpose(1, 2).reshape(-1, num_heads, head_dim).index_select(0, g.dest)


def _split_attention(q, keys, values, num_cached: int, scale) -> torch.Tensor:
    """Cached prefix without mask + new tokens with is_causal, merged via log-sum-exp."""
    out_prefix, lse_prefix = _FLASH_CPU(
        q, keys[:, :, :num_cached], values[:, :, :num_cached], scale=scale
    )
    out_new, lse_new = _FLASH_CPU(
        q, keys[:, :, num_cached:], values[:, :, num_cached:], is_causal=True, scale=scale
    )
    lse = torch.logaddexp(lse_prefix, lse_new)
    weight_prefix = (lse_prefix - lse).exp().unsqueeze(-1)
    weight_new = (lse_new - lse).exp().unsqueeze(-1)
    return out_prefix * weight_prefix + out_new * weight_new


def _attend_single(query, key_cache, value_cache, s: _Single, scale) -> torch.Tensor:
    """Attention of one sequence; returns [q_len, num_heads, head_dim]."""
    num_heads, head_dim = query.shape[1:]
    num_kv_heads = key_cache.shape[2]
    rows = query[s.q_start : s.q_end]
    keys = key_cache.index_select(0, s.block_ids).flatten(0, 1)[: s.seq_len]
    values = value_cache.index_select(0, s.block_ids).flatten(0, 1)[: s.seq_len]
    keys, values = keys.transpose(0, 1).unsqueeze(0), values.transpose(0, 1).unsqueeze(0)
    if s.mode == "decode":
        q = rows.reshape(1, num_kv_heads, num_heads // num_kv_heads, head_dim)
        return F.scaled_dot_product_attention(q, keys, values, scale=scale).view(1, -1, head_dim)
    q = rows.transpose(0, 1).unsqueeze(0)
    if s.mode == "split":
        out = _split_attention(q, keys, values, s.seq_len - (s.q_end - s.q_start), scale)
    else:
        out = F.scaled_dot_product_attention(
            q,
            keys,
            values,
            attn_mask=_additive(s, query.dtype),
            is_causal=s.mode == "causal",
            scale=scale,
            enable_gqa=True,
        )
    return out[0].transpose(0, 1)


def paged_attention(
    query, key_cache, value_cache, block_tables, seq_lens, query_start_loc, scale, *, plan=None
) -> torch.Tensor:
    """Causal attention of the packed queries against their paged contexts (see module doc)."""
    if plan is None:
        plan = make_plan(block_tables, seq_lens, query_start_loc, key_cache.shape[1])
    if plan.block_size != key_cache.shape[1] or plan.num_tokens != query.shape[0]:
        raise RuntimeError(f"plan built for block_size={plan.block_size}, num_tokens="
                           f"{plan.num_tokens}; got {key_cache.shape[1]} and {query.shape[0]}")
    if not plan.singles and len(plan.groups) == 1 and plan.groups[0].identity:
        return _attend_padded(query, key_cache, value_cache, plan.groups[0], scale)
    out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
    for g in plan.groups:
        out.index_copy_(0, g.token_ids, _attend_padded(query, key_cache, value_cache, g, scale))
    for s in plan.singles:
        out[s.q_start : s.q_end] = _attend_single(query, key_cache, value_cache, s, scale)
    return out


def paged_attention_reference(
    query, key_cache, value_cache, block_tables, seq_lens, query_start_loc, scale
) -> torch.Tensor:
    """Per-sequence dense oracle: gather contiguous K/V, repeat heads, explicit causal softmax."""
    block_size, num_kv_heads = key_cache.shape[1], key_cache.shape[2]
    group = query.shape[1] // num_kv_heads
    flat_keys, flat_values = key_cache.flatten(0, 1), value_cache.flatten(0, 1)
    out = torch.empty_like(query)
    for i, seq_len in enumerate(seq_lens.tolist()):
        q_start, q_end = int(query_start_loc[i]), int(query_start_loc[i + 1])
        positions = torch.arange(seq_len)
        slots = block_tables[i, positions // block_size] * block_size + positions % block_size
        keys = flat_keys[slots].double().repeat_interleave(group, dim=1)  # [L, H, D]
        values = flat_values[slots].double().repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", query[q_start:q_end].double(), keys) * scale
        query_positions = positions[seq_len - (q_end - q_start) :]
        hidden = positions.view(1, 1, -1) > query_positions.view(1, -1, 1)
        probs = scores.masked_fill(hidden, float("-inf")).softmax(dim=-1)
        out[q_start:q_end] = torch.einsum("hqk,khd->qhd", probs, values).to(query.dtype)
    return out
