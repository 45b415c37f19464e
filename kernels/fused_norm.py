"""RMSNorm, and residual add + RMSNorm, as one Triton kernel each.

Numerics follow transformers' Qwen2RMSNorm / LlamaRMSNorm step by step, so that bfloat16 results
equal theirs up to the order of the variance sum:
    x32 = x.float(); normed = (x32 * rsqrt(mean(x32^2) + eps)).to(x.dtype); out = weight * normed
The last product runs in promote(weight, x) like torch's: both operands are exact in float32,
so rounding the float32 product once to the output dtype is what torch's bf16 multiply does.
The add variant first rounds residual + x to the input dtype (transformers adds in that dtype),
returns that sum as the new residual and normalises it.

One program per row, the whole row in registers (hidden sizes up to 16k), variance in float32.
On CPU tensors the kernels run under Triton's interpreter (tests); rms_norm_reference is the
torch oracle.
"""

from __future__ import annotations

import torch

from kernels.triton_launch import jit, launch, next_pow2, round_to, tl

MAX_HIDDEN = 16384  # one row per program: beyond this the row no longer fits registers well


def _rms_norm_kernel(
    x_ptr,
    residual_ptr,
    weight_ptr,
    out_ptr,
    residual_out_ptr,
    hidden,
    eps,
    stride_x,
    stride_r,
    stride_o,
    stride_ro,
    ADD: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < hidden
    x = tl.load(x_ptr + row * stride_x + cols, mask=ok, other=0.0)
    if ADD:
        r = tl.load(residual_ptr + row * stride_r + cols, mask=ok, other=0.0)
        # Rounded to the input dtype like transformers' `residual + hidden_states`.
        x = round_to(x.to(tl.float32) + r.to(tl.float32), x.dtype)
        tl.store(residual_out_ptr + row * stride_ro + cols, x, mask=ok)
    x32 = x.to(tl.float32)
    variance = tl.sum(x32 * x32, axis=0) / hidden
    normed = round_to(x32 * (1.0 / tl.sqrt(variance + eps)), x.dtype)
    w = tl.load(weight_ptr + cols, mask=ok, other=0.0)
    out = normed.to(tl.float32) * w.to(tl.float32)
    tl.store(out_ptr + row * stride_o + cols, round_to(out, out_ptr.dtype.element_ty), mask=ok)


_kernel = jit(_rms_norm_kernel)


def _rows(t: torch.Tensor) -> torch.Tensor:
    """[..., hidden] as [rows, hidden] with unit column stride (a view when possible)."""
    flat = t.reshape(-1, t.shape[-1])
    return flat if flat.stride(-1) == 1 else flat.contiguous()


def _check(x: torch.Tensor, weight: torch.Tensor) -> None:
    if weight.shape != (x.shape[-1],):
        raise ValueError(f"weight {tuple(weight.shape)} does not match hidden {x.shape[-1]}")
    if x.shape[-1] > MAX_HIDDEN:
        raise ValueError(f"hidden size {x.shape[-1]} > {MAX_HIDDEN}: use the torch reference")
    if weight.device != x.device:
        raise ValueError(f"weight on {weight.device}, input on {x.device}")


def _launch(x, residual, weight, out, residual_out, eps: float) -> None:
    rows, hidden = x.shape
    if rows == 0:
        return
    add = residual is not None
    launch(
        _kernel,
        (rows,),
        x.device,
        x,
        residual if add else x,
        weight,
        out,
        residual_out if add else out,
        hidden,
        float(eps),
        x.stride(0),
        residual.stride(0) if add else 0,
        out.stride(0),
        residual_out.stride(0) if add else 0,
        ADD=add,
        BLOCK=next_pow2(hidden),
        num_warps=4 if hidden <= 4096 else 8,
    )


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' RMSNorm(x) with this weight and eps, in promote(weight, x) dtype."""
    _check(x, weight)
    flat = _rows(x)
    out = torch.empty(flat.shape, dtype=torch.promote_types(weight.dtype, x.dtype), device=x.device)
    _launch(flat, None, weight, out, None, eps)
    return out.view(x.shape)


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(RMSNorm(residual + x), residual + x): the normalised sum and the new residual."""
    _check(x, weight)
    if residual.shape != x.shape or residual.dtype != x.dtype:
        raise ValueError(
            f"residual {tuple(residual.shape)} {residual.dtype} does not match input "
            f"{tuple(x.shape)} {x.dtype}"
        )
    flat, flat_residual = _rows(x), _rows(residual)
    out = torch.empty(flat.shape, dtype=torch.promote_types(weight.dtype, x.dtype), device=x.device)
    residual_out = torch.empty_like(flat)
    _launch(flat, flat_residual, weight, out, residual_out, eps)
    return out.view(x.shape), residual_out.view(x.shape)


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' Qwen2RMSNorm.forward, verbatim."""
    x32 = x.to(torch.float32)
    variance = x32.pow(2).mean(-1, keepdim=True)
    return weight * (x32 * torch.rsqrt(variance + eps)).to(x.dtype)
