"""SiLU(gate) * up as one Triton kernel: the activation of Qwen2/Llama MLPs without the two
elementwise launches (and the intermediate tensor) of `act_fn(gate_proj(x)) * up_proj(x)`.

Numerics follow torch's: silu is computed in float32 and rounded to the input dtype (what
torch's bf16/fp16 silu does), then the product of the two rounded operands is rounded once.
On CPU tensors the kernel runs under Triton's interpreter (tests).
"""

from __future__ import annotations

import torch

from kernels.triton_launch import jit, launch, round_to, tl

BLOCK = 1024  # columns per program


def _silu_mul_kernel(
    gate_ptr,
    up_ptr,
    out_ptr,
    width,
    stride_g,
    stride_u,
    stride_o,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < width
    gate = tl.load(gate_ptr + row * stride_g + cols, mask=ok, other=0.0)
    up = tl.load(up_ptr + row * stride_u + cols, mask=ok, other=0.0)
    g = gate.to(tl.float32)
    act = round_to(g / (1.0 + tl.exp(-g)), gate.dtype)
    out = act.to(tl.float32) * up.to(tl.float32)
    tl.store(out_ptr + row * stride_o + cols, round_to(out, out_ptr.dtype.element_ty), mask=ok)


_kernel = jit(_silu_mul_kernel)


def _rows(t: torch.Tensor) -> torch.Tensor:
    flat = t.reshape(-1, t.shape[-1])
    return flat if flat.stride(-1) == 1 else flat.contiguous()


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for two tensors of one shape and dtype (any strides)."""
    if gate.shape != up.shape or gate.dtype != up.dtype or gate.device != up.device:
        raise ValueError(
            f"gate {tuple(gate.shape)} {gate.dtype} {gate.device} and up {tuple(up.shape)} "
            f"{up.dtype} {up.device} must match"
        )
    flat_gate, flat_up = _rows(gate), _rows(up)
    rows, width = flat_gate.shape
    out = torch.empty((rows, width), dtype=gate.dtype, device=gate.device)
    if out.numel():
        launch(
            _kernel,
            (rows, -(-width // BLOCK)),
            gate.device,
            flat_gate,
            flat_up,
            out,
            width,
            flat_gate.stride(0),
            flat_up.stride(0),
            out.stride(0),
            BLOCK=BLOCK,
            num_warps=4,
        )
    return out.view(gate.shape)


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up where gate_up = cat([gate, up], -1), the output of one fused GEMM."""
    if gate_up.shape[-1] % 2:
        raise ValueError(f"gate_up's last dim {gate_up.shape[-1]} is not even")
    half = gate_up.shape[-1] // 2
    return silu_mul(gate_up[..., :half], gate_up[..., half:])


def silu_mul_reference(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """transformers' `act_fn(gate) * up` with act_fn = silu."""
    return torch.nn.functional.silu(gate) * up
