"""Rotary position embedding applied in place, all heads of a token in one program: one launch
rotates the query and key heads of a fused q/k/v projection (transformers' apply_rotary_pos_emb
and rotate_half are ~10 launches).

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
    num_heads,
    stride_xt,
    stride_xh,
    stride_ct,
    stride_st,
    HALF: tl.constexpr,
    HALF_PAD: tl.constexpr,
    HEADS_PAD: tl.constexpr,
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
    tl.store(first, round_to(p1 - q1, dtype), mask=ok)
    tl.store(first + HALF, round_to(p2 + q2, dtype), mask=ok)


_kernel = jit(_rotary_kernel)


def rotary_(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [num_tokens, num_heads, head_dim] (any token/head strides, unit stride within a
    head) in place by cos/sin [num_tokens, head_dim] of x's dtype; returns x."""
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
    if x.numel() == 0:
        return x
    half = head_dim // 2
    launch(
        _kernel,
        (num_tokens,),
        x.device,
        x,
        cos,
        sin,
        num_heads,
        x.stride(0),
        x.stride(1),
        cos.stride(0),
        sin.stride(0),
        HALF=half,
        HALF_PAD=next_pow2(half),
        HEADS_PAD=next_pow2(num_heads),
        num_warps=4,
    )
    return x


def rotary_reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """transformers' apply_rotary_pos_emb on x [tokens, heads, head_dim], cos/sin [tokens, D]."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None] + rotated * sin[:, None]
