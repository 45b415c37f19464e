"""Rotary position embedding applied in place, all heads of a token in one program: one launch
rotates the query and key heads of a fused q/k/v projection (transformers' apply_rotary_pos_emb
and rotate_half are ~10 launches). `rotary_and_cache_` also writes the rotated keys and the
values into the paged KV cache in that launch (the attention hook's two indexed copies).

Numerics follow transformers' `q * cos + rotate_half(q) * sin` in the input dtype: each product
is rounded to that dtype, then their sum (for float32 the rounding steps are no-ops). cos and
sin are what the model's rotary embedding returns (already in the input dtype, halves may
differ as with Qwen2.5-Omni's multimodal rope). On CPU tensors the kernel runs under Triton's
interpreter (tests).
"""

from __future__ import annotations

import torch

from kernels.triton_launch import jit, launch, next_pow2, round_to, tl


def _rotary_kernel(
    x_ptr,
    cos_ptr,
    sin_ptr,
    v_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_ptr,
    num_heads,
    num_kv_heads,
    stride_xt,
    stride_xh,
    stride_ct,
    stride_st,
    stride_vt,
    stride_vh,
    HALF: tl.constexpr,
    HALF_PAD: tl.constexpr,
    HEADS_PAD: tl.constexpr,
    KV_PAD: tl.constexpr,
    CACHE: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    h = tl.arange(0, HEADS_PAD)
    d = tl.arange(0, HALF_PAD)
    d_ok = d < HALF
    ok = (h < num_heads)[:, None] & d_ok[None, :]
    first = x_ptr + token * stride_xt + h[:, None] * stride_xh + d[None, :]
    x1 = tl.load(first, mask=ok, other=0.0)
    x2 = tl.load(first + HALF, mask=ok, other=0.0)
    dtype = x1.dtype
    c1 = tl.load(cos_ptr + token * stride_ct + d, mask=d_ok, other=0.0).to(tl.float32)[None, :]
    c2 = tl.load(cos_ptr + token * stride_ct + HALF + d, mask=d_ok, other=0.0).to(tl.float32)
    s1 = tl.load(sin_ptr + token * stride_st + d, mask=d_ok, other=0.0).to(tl.float32)[None, :]
    s2 = tl.load(sin_ptr + token * stride_st + HALF + d, mask=d_ok, other=0.0).to(tl.float32)
    a = x1.to(tl.float32)
    b = x2.to(tl.float32)
    # rotate_half(x) = cat(-x2, x1): out1 = x1*c1 + (-x2)*s1, out2 = x2*c2 + x1*s2.
    p1 = round_to(a * c1, dtype).to(tl.float32)
    q1 = round_to(b * s1, dtype).to(tl.float32)
    p2 = round_to(b * c2[None, :], dtype).to(tl.float32)
    q2 = round_to(a * s2[None, :], dtype).to(tl.float32)
    out1 = round_to(p1 - q1, dtype)
    out2 = round_to(p2 + q2, dtype)
    tl.store(first, out1, mask=ok)
    tl.store(first + HALF, out2, mask=ok)
    if CACHE:  # the last num_kv_heads rows are keys: they and the values go to the token's slot
        slot = tl.load(slot_ptr + token).to(tl.int64) * (num_kv_heads * 2 * HALF)
        kv_head = h - (num_heads - num_kv_heads)
        k_ok = ok & (kv_head >= 0)[:, None]
        k_dst = k_cache_ptr + slot + kv_head[:, None] * (2 * HALF) + d[None, :]
        tl.store(k_dst, out1, mask=k_ok)
        tl.store(k_dst + HALF, out2, mask=k_ok)
        j = tl.arange(0, KV_PAD)
        v_ok = (j < num_kv_heads)[:, None] & d_ok[None, :]
        v_src = v_ptr + token * stride_vt + j[:, None] * stride_vh + d[None, :]
        v_dst = v_cache_ptr + slot + j[:, None] * (2 * HALF) + d[None, :]
        tl.store(v_dst, tl.load(v_src, mask=v_ok, other=0.0), mask=v_ok)
        tl.store(v_dst + HALF, tl.load(v_src + HALF, mask=v_ok, other=0.0), mask=v_ok)


_kernel = jit(_rotary_kernel)


def rotary_(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [num_tokens, num_heads, head_dim] (any token/head strides, unit stride within a
    head) in place by cos/sin [num_tokens, head_dim] of x's dtype; returns x."""
    _check(x, cos, sin)
    _launch(x, cos, sin, None)
    return x


def rotary_and_cache_(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> torch.Tensor:
    """rotary_ of x, whose last Hkv heads are keys, and in the same launch what
    kernels/cache_ops.py's reshape_and_cache does: the rotated keys and `value` [num_tokens,
    Hkv, head_dim] (unit last stride) into slot slot_mapping[i] of the paged caches
    [num_blocks, block_size, Hkv, head_dim] (contiguous, x's dtype). Returns x."""
    _check(x, cos, sin)
    num_tokens, num_heads, head_dim = x.shape
    num_kv_heads = value.shape[1] if value.dim() == 3 else -1
    for name, cache in (("key_cache", key_cache), ("value_cache", value_cache)):
        if cache.shape[2:] != (num_kv_heads, head_dim) or not cache.is_contiguous():
            want = f"contiguous [blocks, block_size, {num_kv_heads}, {head_dim}]"
            raise ValueError(f"{name} {tuple(cache.shape)} must be {want}")
        if cache.dtype != x.dtype or cache.device != x.device:
            raise ValueError(f"{name} is {cache.dtype} on {cache.device}, x {x.dtype}")
    expected = (num_tokens, num_kv_heads, head_dim)
    if value.shape != expected or value.stride(-1) != 1 or not 0 < num_kv_heads <= num_heads:
        raise ValueError(f"value {tuple(value.shape)} must be {expected}, unit last stride")
    if slot_mapping.shape != (num_tokens,) or slot_mapping.device != x.device:
        raise ValueError(f"slot_mapping {tuple(slot_mapping.shape)} must be [{num_tokens}]")
    _launch(x, cos, sin, (value, key_cache, value_cache, slot_mapping))
    return x


def _check(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    if x.dim() != 3 or x.stride(-1) != 1:
        raise ValueError(
            f"x must be [tokens, heads, head_dim] with unit last stride, got {x.shape}"
        )
    num_tokens, num_heads, head_dim = x.shape
    if head_dim % 2:
        raise ValueError(f"head_dim {head_dim} is odd")
    for name, t in (("cos", cos), ("sin", sin)):
        if t.shape != (num_tokens, head_dim) or t.stride(-1) != 1:
            raise ValueError(f"{name} {tuple(t.shape)} must be [{num_tokens}, {head_dim}]")
        if t.dtype != x.dtype or t.device != x.device:
            raise ValueError(f"{name} is {t.dtype} on {t.device}, x {x.dtype} on {x.device}")


def _launch(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: tuple | None) -> None:
    """One program per token; with `cache` (value, key_cache, value_cache, slot_mapping) the
    keys and values are written to their slots too. Without it the cache pointers are x's
    (never read or written: CACHE is a constexpr)."""
    num_tokens, num_heads, head_dim = x.shape
    if x.numel() == 0:
        return
    value, key_cache, value_cache, slots = cache if cache is not None else (x, x, x, x)
    num_kv_heads = key_cache.shape[2] if cache is not None else 0
    half = head_dim // 2
    launch(
        _kernel,
        (num_tokens,),
        x.device,
        x,
        cos,
        sin,
        value,
        key_cache,
        value_cache,
        slots,
        num_heads,
        num_kv_heads,
        x.stride(0),
        x.stride(1),
        cos.stride(0),
        sin.stride(0),
        value.stride(0),
        value.stride(1),
        HALF=half,
        HALF_PAD=next_pow2(half),
        HEADS_PAD=next_pow2(num_heads),
        KV_PAD=next_pow2(max(1, num_kv_heads)),
        CACHE=cache is not None,
        num_warps=4,
    )


def rotary_reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """transformers' apply_rotary_pos_emb on x [tokens, heads, head_dim], cos/sin [tokens, D]."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None] + rotated * sin[:, None]
