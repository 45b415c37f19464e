"""Split-KV (flash-decoding) for the Triton paged attention: when a step has too few query tiles
to fill the GPU, each (tile, kv head) program is split over its key range, the splits run side
by side, and a second kernel combines their partial results.

Why: the attention grid is (query tiles, kv heads) and each program walks its keys serially. A
decode batch of one request on a model with 2-4 kv heads (or one short suffix after a long cached
prefix) runs 2-8 programs on a GPU of 132 SMs, each reading the whole context alone.

Invariants:
- The number of splits is chosen on the host from the grid's shape, an upper bound of the
  step's context length and the SM count, never from device values: a CUDA graph captured with
  it is valid for every replay (the bound there is max_model_len).
- Each split program takes whole key tiles, at least MIN_SHARE keys; a context shorter than the
  splits leaves the later ones empty.
- Every (split, token, head) of the partial buffers is written by the split kernel (an empty
  split: output 0, log-sum -inf, weight 0 in the combine), so the combine reads nothing left
  from an earlier step, and the buffers need no clearing.
"""

from __future__ import annotations

import functools

import torch

from kernels.triton_launch import HAVE_TRITON, launch, next_pow2, tl, triton

MIN_SHARE = 256  # keys per split at least: below that, a split's fixed costs dominate its work
MAX_SPLITS = 32
PROGRAMS_PER_SM = 2  # split until the grid holds this many programs per SM


def num_kv_splits(num_programs: int, max_context: int | None, num_sms: int) -> int:
    """Splits of every (tile, kv head) program's keys: 1 (no split) when the grid already fills
    the GPU or no bound of the context is known, else as many as fill PROGRAMS_PER_SM x num_sms
    programs, each with MIN_SHARE keys or more of a max_context-long context."""
    if max_context is None or num_sms <= 0 or num_programs >= num_sms:
        return 1
    by_occupancy = -(-PROGRAMS_PER_SM * num_sms // max(1, num_programs))
    return max(1, min(by_occupancy, max_context // MIN_SHARE, MAX_SPLITS))


def unsplit_context() -> int:
    """The longest context bound num_kv_splits never splits for (under two shares)."""
    return 2 * MIN_SHARE - 1


@functools.cache
def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device; 0 elsewhere (no split by default)."""
    if device.type != "cuda":
        return 0
    return int(torch.cuda.get_device_properties(device).multi_processor_count)


def _combine_kernel(
    part_out_ptr,
    part_lse_ptr,
    out_ptr,
    num_rows,
    num_splits,
    stride_ot,
    stride_oh,
    stride_od,
    NUM_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
):
    """One program per (token, head): out = sum_s w_s o_s / sum_s w_s, w_s = 2^(lse_s - max)."""
    token = tl.program_id(0)
    head = tl.program_id(1)
    row = token * NUM_HEADS + head
    d = tl.arange(0, HEAD_DIM_PAD)
    d_ok = d < HEAD_DIM
    m = tl.load(part_lse_ptr + row)
    for s in range(1, num_splits):
        m = tl.maximum(m, tl.load(part_lse_ptr + s * num_rows + row))
    total = m * 0.0
    acc = tl.zeros((HEAD_DIM_PAD,), dtype=tl.float32)
    for s in range(0, num_splits):
        lse = tl.load(part_lse_ptr + s * num_rows + row)
        part = (s * num_rows + row).to(tl.int64) * HEAD_DIM
        o = tl.load(part_out_ptr + part + d, mask=d_ok, other=0.0)
        w = tl.exp2(lse - m)
        total += w
        acc += w * o
    acc = acc / total
    offset = token * stride_ot + head * stride_oh + d * stride_od
    tl.store(out_ptr + offset, acc.to(out_ptr.dtype.element_ty), mask=d_ok)


# As the attention kernel's: the step's sizes are not specialized on (one binary for all).
if HAVE_TRITON:
    _combine = triton.jit(_combine_kernel, do_not_specialize=["num_rows", "num_splits"])


def plan(
    num_programs: int,
    max_context: int | None,
    query: torch.Tensor,
    step_cache: dict | None,
    num_splits: int | None = None,
) -> tuple[int, torch.Tensor, torch.Tensor]:
    """(num_splits, partial outputs, partial log-sums) for one attention launch of num_programs
    (tile, kv head) programs. max_context: an upper bound of the step's sequence lengths known
    on the host (a CUDA graph's: max_model_len); None: no split. num_splits: given (tests), or
    num_kv_splits's choice on this device. Without a split, the buffers are float32
    placeholders the kernel never writes (they keep its signature: one binary for both)."""
    if num_splits is None:
        num_splits = num_kv_splits(num_programs, max_context, num_sms(query.device))
    if num_splits <= 1:
        placeholder = _placeholder(query.device)
        return 1, placeholder, placeholder
    return (num_splits, *_buffers(num_splits, query, step_cache))


@functools.cache
def _placeholder(device: torch.device) -> torch.Tensor:
    return torch.zeros(4, dtype=torch.float32, device=device)


def _buffers(
    num_splits: int, query: torch.Tensor, step_cache: dict | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The partial outputs [num_splits, T, H, D] and log-sums [num_splits, T, H], float32; one
    pair per step shared by its layers (which run one after another on one stream)."""
    key = ("split_kv", num_splits)
    if step_cache is not None and key in step_cache:
        return step_cache[key]
    num_tokens, num_heads, head_dim = query.shape
    shape = (num_splits, num_tokens, num_heads)
    buffers = (
        torch.empty((*shape, head_dim), dtype=torch.float32, device=query.device),
        torch.empty(shape, dtype=torch.float32, device=query.device),
    )
    if step_cache is not None:
        step_cache[key] = buffers
    return buffers


def combine_splits(part_out: torch.Tensor, part_lse: torch.Tensor, out: torch.Tensor) -> None:
    """Write into out [T, H, D] the softmax-weighted sum of the splits' partial outputs."""
    num_splits, num_tokens, num_heads, head_dim = part_out.shape
    if num_tokens == 0:
        return
    launch(
        _combine,
        (num_tokens, num_heads),
        out.device,
        part_out,
        part_lse,
        out,
        num_tokens * num_heads,
        num_splits,
        *out.stride(),
        NUM_HEADS=num_heads,
        HEAD_DIM=head_dim,
        HEAD_DIM_PAD=max(16, next_pow2(head_dim)),
    )
