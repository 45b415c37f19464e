"""SyncCounter: the calls in a piece of torch code that make the host wait for a GPU, counted on
any device (the CPU included) and attributed to the component whose code made them.

What is counted (each would block the host until the GPU's queued work is done, were the tensor
on a GPU):
- a scalar read: `.item()`, `int()`/`float()`/`bool()` of a tensor (aten item,
  _local_scalar_dense, is_nonzero);
- `.tolist()` (patched while counting: it reads the tensor without an aten op);
- data-dependent shapes: nonzero, masked_select, and indexing (index / index_put_) with a bool
  mask;
- a tensor made from Python data (`torch.tensor(list)`, indexing with a Python list): on a GPU
  that is a blocking copy from pageable memory (aten lift_fresh; `torch.from_numpy` makes one
  too, but a host array is how a step stages its one pinned upload, so it is not counted; nor
  is a Python scalar, which kernels take by value);
- a copy between devices unless it is non_blocking with its host side pinned.
Not counted: waits on CUDA events or streams (none of the components counted here calls one).

Attribution: each counted call goes to the innermost frame on the Python stack whose code is one
of the `components` functions given (a bound method's underlying function counts for every
instance); calls outside all of them go to "other".
"""

from __future__ import annotations

import inspect
import sys
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten

SCALAR_READS = {aten.item.default, aten._local_scalar_dense.default, aten.is_nonzero.default}
DATA_DEPENDENT = {aten.nonzero.default, aten.masked_select.default}
INDEXING = {aten.index.Tensor, aten.index_put_.default, aten.index_put.default}
FROM_PYTHON = {aten.lift_fresh.default, aten.lift_fresh_copy.default}
COPIES = {
    aten._to_copy.default,
    aten.to.device,
    aten.to.dtype_layout,
    aten.to.other,
    aten.copy_.default,
}
OTHER = "other"


def _bound(func: Any, args: tuple, kwargs: dict) -> dict[str, Any]:
    names = [a.name for a in func._schema.arguments]
    return {**dict(zip(names, args, strict=False)), **kwargs}


def _blocking_copy(func: Any, args: tuple, kwargs: dict) -> bool:
    bound = _bound(func, args, kwargs)
    source = bound["self"]
    if func is aten.copy_.default:
        destination, source = bound["self"], bound["src"]
        devices = (destination.device, source.device)
        host = destination if destination.device.type == "cpu" else source
    else:
        target = bound["other"].device if func is aten.to.other else bound.get("device")
        if target is None:
            return False
        devices = (torch.device(target), source.device)
        host = source if source.device.type == "cpu" else None  # a new pageable tensor
    if devices[0] == devices[1]:
        return False
    pinned = host is not None and host.is_pinned()
    return not (bound.get("non_blocking", False) and pinned)


def why_it_syncs(func: Any, args: tuple, kwargs: dict) -> str | None:
    """The reason this aten call would make the host wait for a GPU, or None."""
    if func in SCALAR_READS:
        return "scalar read"
    if func in DATA_DEPENDENT:
        return str(func.overloadpacket.__name__)
    if func in INDEXING:
        indices = _bound(func, args, kwargs)["indices"]
        if any(i is not None and i.dtype in (torch.bool, torch.uint8) for i in indices):
            return "bool-mask indexing"
        return None
    if func in FROM_PYTHON:
        # A 0-dim one is a Python scalar (`x[mask] = 1.0`): kernels take CPU scalars by value;
        # an empty one (`torch.tensor([])`, a cache's placeholder) has nothing to copy.
        return "tensor from Python data" if args[0].dim() and args[0].numel() else None
    if func in COPIES and _blocking_copy(func, args, kwargs):
        return "blocking copy between devices"
    return None


def _library(filename: str) -> bool:
    """Code of torch, transformers or this counter (a site is the first frame outside them)."""
    return any(part in filename for part in ("/torch/", "/transformers/", "sync_counter.py"))


class SyncCounter(TorchDispatchMode):
    """Use as a context manager around the code to count; `counts[component]` lists the
    reasons of the calls attributed to that component, in order."""

    def __init__(self, components: Mapping[str, Callable | Iterable[Callable]]) -> None:
        super().__init__()
        self._codes: dict[Any, str] = {}
        for name, functions in components.items():
            for function in functions if isinstance(functions, Iterable) else [functions]:
                # The function's own code, not a decorator's (torch.no_grad's wrapper code is
                # shared by every decorated function: it would claim all of their frames).
                unwrapped = inspect.unwrap(getattr(function, "__func__", function))
                self._codes[unwrapped.__code__] = name
        self.counts: dict[str, list[str]] = defaultdict(list)
        self.sites: dict[str, list[str]] = defaultdict(list)  # "file:line reason", as counts
        self._in_from_numpy = 0
        self._in_tolist = 0  # a GPU tensor's tolist copies to the host: one sync, counted once
        self._saved: dict[str, Any] = {}

    def _record(self, why: str) -> None:
        frame = sys._getframe(2)
        site = None
        while frame is not None and frame.f_code not in self._codes:
            if site is None and not _library(frame.f_code.co_filename):
                site = f"{frame.f_code.co_filename}:{frame.f_lineno}"
            frame = frame.f_back  # type: ignore[assignment]
        if site is None and frame is not None:
            site = f"{frame.f_code.co_filename}:{frame.f_lineno}"
        component = self._codes[frame.f_code] if frame is not None else OTHER
        self.counts[component].append(why)
        self.sites[component].append(f"{site} {why}")

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        why = why_it_syncs(func, args, kwargs)
        if why is None or self._in_tolist:
            return func(*args, **kwargs)
        if not (why == "tensor from Python data" and self._in_from_numpy):
            self._record(why)
        return func(*args, **kwargs)

    def __enter__(self) -> SyncCounter:
        tolist, from_numpy = torch.Tensor.tolist, torch.from_numpy
        counter = self

        def counted_tolist(tensor: torch.Tensor) -> Any:
            counter._record("tolist")
            counter._in_tolist += 1
            try:
                return tolist(tensor)
            finally:
                counter._in_tolist -= 1

        def uncounted_from_numpy(array: Any) -> torch.Tensor:
            counter._in_from_numpy += 1
            try:
                return from_numpy(array)
            finally:
                counter._in_from_numpy -= 1

        self._saved = {"tolist": tolist, "from_numpy": from_numpy}
        torch.Tensor.tolist = counted_tolist  # type: ignore[method-assign]
        torch.from_numpy = uncounted_from_numpy
        super().__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        torch.Tensor.tolist = self._saved["tolist"]  # type: ignore[method-assign]
        torch.from_numpy = self._saved["from_numpy"]

    def of(self, component: str) -> list[str]:
        return list(self.counts.get(component, []))
