"""Paged attention over a packed ragged batch in torch: the CPU path (CUDA runs the Triton kernel of
kernels/triton_paged_attention.py, which this module's paged_attention_reference checks).

Layout: query [num_tokens, num_heads, head_dim]; sequence i owns query rows
query_start_loc[i]:query_start_loc[i+1], which are the LAST q_len_i positions of its context of
seq_lens[i] tokens whose K/V already sit in the caches [num_blocks, block_size, num_kv_heads,
head_dim] at the blocks listed in block_tables[i]. Query head h reads kv head h // group.

Two variants share one plan, built once per model step by make_plan and reused by every layer:
- padded: gather the blocks of S sequences into [S, max_len, Hkv, D], one SDPA call with a
  padding + bottom-right causal mask; the GQA group is folded into the query axis so keys are
  never repeated per head. The loop variant is this with S = 1 per sequence.
- single (long prefill chunks): is_causal SDPA when nothing is cached, else a split into "cached
  prefix, no mask" + "new tokens, is_causal" merged by log-sum-exp (skips the masked triangle).
make_plan picks per sequence; bench/paged_attention.py holds the measurements.
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
PADDED_MAX_Q = 16  # chunks up to this many queries share padded calls in "auto"
# Padded keys per group: a group's gathered K/V must stay cache-resident for the SDPA that reads
# it right after (one big gather of many long contexts is memory-bound and loses to the loop).
PADDED_MAX_KEYS = 4096
STRATEGIES = ("auto", "loop", "padded")


@dataclass(eq=False)
class _Single:
    """A prefill chunk attended alone with is_causal (nothing cached) or the split (cached)."""

    q_start: int
    q_end: int
    seq_len: int
    block_ids: torch.Tensor  # [ceil(seq_len / block_size)]
    split: bool


@dataclass(eq=False)
class _Padded:
    """Sequences attended in one padded SDPA call (a group of one is the loop's general case)."""

    token_ids: torch.Tensor  # [num_group_tokens] query rows owned by the group, padded order
    dest: torch.Tensor | None  # row of each token in the [S * max_q] padded layout (max_q > 1)
    block_ids: torch.Tensor  # [S * max_blocks], padding entries are any valid block id
    num_seqs: int
    max_q: int
    max_len: int
    mask: torch.Tensor | None  # bool [S, 1, max_q, max_len]; None when every key is visible
    identity: bool  # token_ids == arange(num_tokens): no gather/scatter of query rows needed
    masks: dict = field(default_factory=dict)  # additive masks by (dtype, group), built lazily


@dataclass(eq=False)
class PagedAttentionPlan:
    """Everything shape-dependent about one step's batch; valid for every layer of that step."""

    block_size: int
    num_tokens: int
    max_seq_len: int
    singles: list[_Single]
    groups: list[_Padded]


def _additive(g: _Padded, dtype: torch.dtype, group: int) -> torch.Tensor | None:
    """The bool mask as 0/-inf in the query dtype with each row repeated `group` times (GQA
    fold), built once per plan: SDPA wants float masks and every layer reuses it."""
    if g.mask is None:
        return None
    mask = g.masks.get((dtype, group))
    if mask is None:
        rows = g.mask.repeat_interleave(group, dim=2) if g.max_q > 1 else g.mask
        mask = torch.zeros(rows.shape, dtype=dtype).masked_fill_(~rows, float("-inf"))
        g.masks[(dtype, group)] = mask
    return mask


def _make_group(seq_ids, starts, lens, block_tables, block_size, num_tokens) -> _Padded:
    # Plain Python until the end: a step builds many small groups and torch ops cost ~10 us each.
    q_lens = [starts[i + 1] - starts[i] for i in seq_ids]
    ctx_lens = [lens[i] for i in seq_ids]
    max_q, max_len = max(q_lens), max(ctx_lens)
    token_ids = [t for i in seq_ids for t in range(starts[i], starts[i + 1])]
    dest = None
    if max_q > 1:
        dest = torch.tensor([s * max_q + t for s, q in enumerate(q_lens) for t in range(q)])
    mask = None
    if max_q > 1 or min(ctx_lens) < max_len:
        # Row t of sequence s sees key j iff j <= seq_len - q_len + t and j < seq_len. Padded
        # rows (t >= q_len) thus see the whole context: no row is fully masked, so no NaN.
        ctx = torch.tensor(ctx_lens).view(-1, 1, 1)
        last = ctx - torch.tensor(q_lens).view(-1, 1, 1) + torch.arange(max_q).view(1, -1, 1)
        cols = torch.arange(max_len)
        mask = ((cols <= last) & (cols < ctx)).unsqueeze(1)
    return _Padded(
        token_ids=torch.tensor(token_ids),
        dest=dest,
        block_ids=block_tables[seq_ids, : -(-max_len // block_size)].reshape(-1),
        num_seqs=len(seq_ids),
        max_q=max_q,
        max_len=max_len,
        mask=mask,
        # seq_ids ascend and each owns a contiguous row range: covering all rows means identity.
        identity=len(token_ids) == num_tokens,
    )


def _split_by_keys(seq_ids: list[int], lens: list[int]) -> list[list[int]]:
    """Groups of at most PADDED_MAX_KEYS padded keys (or one sequence), longest first."""
    groups: list[list[int]] = []
    for i in sorted(seq_ids, key=lambda i: -lens[i]):
        # The group's first member is its longest and sets the padded length.
        if groups and (len(groups[-1]) + 1) * lens[groups[-1][0]] <= PADDED_MAX_KEYS:
            groups[-1].append(i)
        else:
            groups.append([i])
    # Batch order inside a group keeps query rows contiguous (no gather/scatter when all fit).
    return [sorted(group) for group in groups]


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
    if len(starts) != num_seqs + 1 or starts[0] != 0 or block_tables.shape[0] != num_seqs:
        raise ValueError(
            f"{num_seqs} seq_lens need query_start_loc [0, ...] of {num_seqs + 1} entries and "
            f"{num_seqs} block_tables rows, got {starts[:3]}... ({len(starts)}) and "
            f"{block_tables.shape[0]}"
        )
    block_tables = block_tables.to(torch.int64)
    singles, alone, decode_ids, short_ids = [], [], [], []
    for i in range(num_seqs):
        q_len, seq_len = starts[i + 1] - starts[i], lens[i]
        if not 0 <= q_len <= seq_len or -(-seq_len // block_size) > block_tables.shape[1]:
            raise ValueError(
                f"sequence {i}: q_len={q_len}, seq_len={seq_len}, block_size="
                f"{block_size}, block table width={block_tables.shape[1]}"
            )
        causal = 1 < q_len == seq_len and (strategy == "loop" or q_len > PADDED_MAX_Q)
        split = q_len < seq_len and q_len >= SPLIT_MIN_Q and _FLASH_CPU is not None
        if q_len == 0:
            continue
        if strategy != "padded" and (causal or split):
            block_ids = block_tables[i, : -(-seq_len // block_size)].contiguous()
            singles.append(_Single(starts[i], starts[i + 1], seq_len, block_ids, split))
        elif strategy == "loop" or (q_len > PADDED_MAX_Q and strategy == "auto"):
            alone.append([i])
        else:
            (decode_ids if q_len == 1 else short_ids).append(i)
    units = alone + _split_by_keys(decode_ids, lens) + _split_by_keys(short_ids, lens)
    groups = [_make_group(ids, starts, lens, block_tables, block_size, starts[-1]) for ids in units]
    return PagedAttentionPlan(block_size, starts[-1], max(lens, default=0), singles, groups)


def _attend_padded(query, key_cache, value_cache, g: _Padded, scale) -> torch.Tensor:
    """Attention of one padded group; returns [num_group_tokens, num_heads, head_dim]."""
    num_heads, head_dim = query.shape[1:]
    num_kv_heads = key_cache.shape[2]
    group = num_heads // num_kv_heads
    shape = (g.num_seqs, -1, num_kv_heads, head_dim)
    keys = key_cache.index_select(0, g.block_ids).view(shape)[:, : g.max_len].transpose(1, 2)
    values = value_cache.index_select(0, g.block_ids).view(shape)[:, : g.max_len].transpose(1, 2)
    rows = query if g.identity else query.index_select(0, g.token_ids)
    if g.dest is not None:
        rows = rows.new_zeros(g.num_seqs * g.max_q, num_heads, head_dim).index_copy_(
            0, g.dest, rows
        )
    # Fold the GQA group into the query axis: [S, Hkv, max_q * group, D] against [S, Hkv, L, D],
    # rows ordered (t, g), so keys are never repeated per query head.
    shape = (g.num_seqs, g.max_q, num_kv_heads, group, head_dim)
    q = rows.reshape(shape).transpose(1, 2).reshape(g.num_seqs, num_kv_heads, -1, head_dim)
    mask = _additive(g, query.dtype, group)
    out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=scale)
    out = out.view(g.num_seqs, num_kv_heads, g.max_q, group, head_dim).transpose(1, 2)
    out = out.reshape(-1, num_heads, head_dim)
    return out if g.dest is None else out.index_select(0, g.dest)


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
    """Attention of one prefill chunk; returns [q_len, num_heads, head_dim]."""
    keys = key_cache.index_select(0, s.block_ids).flatten(0, 1)[: s.seq_len]
    values = value_cache.index_select(0, s.block_ids).flatten(0, 1)[: s.seq_len]
    keys, values = keys.transpose(0, 1).unsqueeze(0), values.transpose(0, 1).unsqueeze(0)
    q = query[s.q_start : s.q_end].transpose(0, 1).unsqueeze(0)
    if s.split:
        out = _split_attention(q, keys, values, s.seq_len - (s.q_end - s.q_start), scale)
    else:
        out = F.scaled_dot_product_attention(
            q, keys, values, is_causal=True, scale=scale, enable_gqa=True
        )
    return out[0].transpose(0, 1)


def paged_attention(
    query, key_cache, value_cache, block_tables, seq_lens, query_start_loc, scale, *, plan=None
) -> torch.Tensor:
    """Causal attention of the packed queries against their paged contexts (see module doc)."""
    if plan is None:
        plan = make_plan(block_tables, seq_lens, query_start_loc, key_cache.shape[1])
    if plan.block_size != key_cache.shape[1] or plan.num_tokens != query.shape[0]:
        raise RuntimeError(
            f"plan built for block_size={plan.block_size}, num_tokens="
            f"{plan.num_tokens}; got {key_cache.shape[1]} and {query.shape[0]}"
        )
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
