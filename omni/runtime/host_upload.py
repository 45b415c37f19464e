"""Host arrays to a device in one copy: what a step builds with numpy on the host goes over in a
single non_blocking copy from pinned memory, so it never makes the host wait for the device.

`torch.tensor(list, device=cuda)` and `.to(cuda)` of a pageable tensor are blocking copies: each
waits for the whole stream, i.e. for every kernel queued so far. One pinned staging buffer and
one non_blocking copy per step avoid that; the caching host allocator keeps the staging buffer
from reuse until the copy has run. On the CPU the arrays are used in place (no copy at all).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

# Every array starts 16-byte aligned (the widest element is 8): a kernel that specializes on its
# pointers' alignment (Triton does, by default) then sees the same alignment whatever the sizes
# of the arrays before it in the step's upload.
_ALIGN = 16


def upload(arrays: Sequence[np.ndarray], device: torch.device) -> list[torch.Tensor]:
    """The arrays (any numeric dtypes, any shapes) as tensors on `device`, in order: views of
    the arrays on the CPU; on another device, views into one buffer that went over in one
    non_blocking copy from a pinned host buffer."""
    arrays = [np.ascontiguousarray(a) for a in arrays]
    if device.type == "cpu":
        return [torch.from_numpy(a) for a in arrays]
    offsets, size = layout(arrays)
    staging = torch.empty(max(size, _ALIGN), dtype=torch.uint8, pin_memory=True)
    host = staging.numpy()
    for a, offset in zip(arrays, offsets, strict=True):
        host[offset : offset + a.nbytes] = a.reshape(-1).view(np.uint8)
    on_device = staging.to(device, non_blocking=True)
    out = []
    for a, offset in zip(arrays, offsets, strict=True):
        dtype = torch.from_numpy(a[:0].reshape(-1)).dtype
        view = on_device[offset : offset + a.nbytes].view(dtype)
        out.append(view.view(a.shape))
    return out


def layout(arrays: Sequence[np.ndarray]) -> tuple[list[int], int]:
    """Each array's byte offset in the upload buffer (a multiple of 16), and the buffer's size."""
    offsets, size = [], 0
    for a in arrays:
        offsets.append(size)
        size += -(-a.nbytes // _ALIGN) * _ALIGN
    return offsets, size
