"""Launching a Triton kernel on the tensors' device: compiled on CUDA, interpreted on the CPU.

The CPU path exists for tests only (Triton's interpreter runs the kernel body with numpy; slow,
not thread-safe). It does what TRITON_INTERPRET=1 at import would have done, for one launch:
without that variable triton.jit compiled the kernel for the GPU and triton.language's own
jitted helpers (tl.sum, tl.exp, ...) refuse to be called from Python. Every kernel of kernels/,
the paged attention included, launches through here.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Callable, Iterator
from typing import Any

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the environment
    triton = None
    tl = types.SimpleNamespace(constexpr=None)  # for kernel annotations; never launched

HAVE_TRITON = triton is not None


def _round_to(x, dtype: tl.constexpr):
    """float32 x rounded to nearest-even in dtype, as torch's casts do. bfloat16 is rounded by
    hand: Triton's interpreter truncates float32 -> bfloat16 casts (the compiled cast would do);
    the integer add carries into the exponent exactly as rounding must, and keeps NaN a NaN."""
    if dtype == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = bits + 0x7FFF + ((bits >> 16) & 1)
        return (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        return x.to(dtype)


def jit(fn: Callable) -> Any:
    """triton.jit(fn), or None without triton (the caller checks HAVE_TRITON before launching)."""
    return triton.jit(fn) if HAVE_TRITON else None


def num_compiled(kernel: Any) -> int:
    """Variants of a jitted kernel compiled so far in this process, on every device (0 without
    Triton, or before its first launch): each specialization key is a compile of its own."""
    caches = getattr(kernel, "device_caches", None) or {}
    return sum(len(cache[0]) for cache in caches.values())


@contextlib.contextmanager
def _interpreted(kernel: Any) -> Iterator[Any]:
    """The interpreted form of a jitted kernel, with every JITFunction call made while it runs
    (triton.language's helpers) routed through the interpreter and undone afterwards: left in
    place, the interpreter's patches of triton.language break every later compilation."""
    from triton.runtime.interpreter import InterpretedFunction, _patch_lang
    from triton.runtime.jit import JITFunction

    if not isinstance(kernel, JITFunction):  # TRITON_INTERPRET=1 was set: already interpreted
        yield kernel
        return
    rewritten: dict = {}

    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        function = rewritten.get(self.fn)
        if function is None:
            function = rewritten[self.fn] = InterpretedFunction(self.fn).rewrite()
        scope = _patch_lang(self.fn)
        try:
            return function(*args, **kwargs)
        finally:
            scope.restore()

    original = JITFunction.__call__
    JITFunction.__call__ = call  # type: ignore[method-assign]
    try:
        with triton.knobs.runtime.scope():
            triton.knobs.runtime.interpret = True
            yield InterpretedFunction(kernel.fn)
    finally:
        JITFunction.__call__ = original  # type: ignore[method-assign]


def launch(kernel: Any, grid: tuple[int, ...], device: torch.device, *args: Any, **kw: Any) -> None:
    """kernel[grid](*args, **kw), interpreted when the tensors live on the CPU."""
    if not HAVE_TRITON:
        raise RuntimeError("this kernel needs the triton package")
    if device.type == "cpu":
        with _interpreted(kernel) as interpreted:
            interpreted[grid](*args, **kw)
    else:
        kernel[grid](*args, **kw)


round_to = jit(_round_to)


def next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())
