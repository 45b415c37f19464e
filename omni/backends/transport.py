"""torch <-> numpy at the Ray actor boundary, so per-token tensors cross the object store zero-copy.

Ray serializes numpy arrays (also nested inside dataclasses and dicts) out of band: a reader on the
same node maps them straight from shared memory, read-only. torch tensors are pickled instead,
which copies them through a byte string on both ends (about 4x slower, see bench/pipeline_hop.py).
So every tensor in a message is replaced by a `WireTensor` (a numpy array plus the torch dtype)
before `ray.put`, and turned back into a torch tensor on arrival.

On arrival the array is copied once (`np.array(...)`): the copy is writable, owned by the receiver,
and does not pin the sender's object in the object store for as long as the tensor lives.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from omni.messages import RoutedDelta, RoutedInput, StageEvent, StageInput, StageResult, StageUpdate

# numpy has no bfloat16: such tensors travel as their raw 16-bit patterns.
_RAW_VIEW = {torch.bfloat16: torch.int16}


@dataclass
class WireTensor:
    """A torch tensor in transit: its data as a numpy array and its torch dtype's name."""

    array: np.ndarray
    dtype: str

    @classmethod
    def pack(cls, tensor: torch.Tensor) -> WireTensor:
        tensor = tensor.detach().cpu().contiguous()
        raw = _RAW_VIEW.get(tensor.dtype)
        array = tensor.view(raw).numpy() if raw is not None else tensor.numpy()
        return cls(array, str(tensor.dtype).removeprefix("torch."))

    def unpack(self, copy: bool = True) -> torch.Tensor:
        # copy=False keeps the zero-copy view (read-only memory: the caller must not write to it).
        array = np.array(self.array, copy=True) if copy else self.array
        tensor = torch.from_numpy(array) if copy else _readonly_view(array)
        dtype = getattr(torch, self.dtype)
        return tensor.view(dtype) if dtype in _RAW_VIEW else tensor


def _readonly_view(array: np.ndarray) -> torch.Tensor:
    import warnings

    with warnings.catch_warnings():
        # torch warns that the array is not writable; the caller has promised not to write.
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(array)


def pack(value: Any) -> Any:
    """Every torch tensor inside dicts, lists and tuples replaced by a WireTensor."""
    if isinstance(value, torch.Tensor):
        return WireTensor.pack(value)
    if isinstance(value, dict):
        return {k: pack(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(pack(v) for v in value)
    return value


def unpack(value: Any, copy: bool = True) -> Any:
    """The inverse of `pack`: every WireTensor back to a torch tensor."""
    if isinstance(value, WireTensor):
        return value.unpack(copy)
    if isinstance(value, dict):
        return {k: unpack(v, copy) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(unpack(v, copy) for v in value)
    return value


def tensor_bytes(value: Any) -> int:
    """Bytes of every torch tensor inside dicts, lists and tuples (what a message carries)."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(tensor_bytes(v) for v in value.values())
    if isinstance(value, list | tuple):
        return sum(tensor_bytes(v) for v in value)
    return 0


def pack_result(result: StageResult) -> StageResult:
    return dataclasses.replace(result, tensors=pack(result.tensors), audio=pack(result.audio))


def unpack_result(result: StageResult, copy: bool = True) -> StageResult:
    return dataclasses.replace(
        result, tensors=unpack(result.tensors, copy), audio=unpack(result.audio, copy)
    )


def light_result(result: StageResult) -> StageResult:
    """The result without its tensors: what the driver needs to route (ids, tokens, errors)."""
    return dataclasses.replace(result, tensors={}, audio=None)


Item = StageInput | RoutedInput | RoutedDelta


def pack_input(item: Item) -> Item:
    """Tensors of a stage's input (root extras, the original prompt's, a streamed partial
    upstream result or piece) as WireTensors."""
    if isinstance(item, StageInput):
        return dataclasses.replace(item, extras=pack(item.extras))
    if isinstance(item, RoutedDelta):
        return dataclasses.replace(item, piece=pack_result(item.piece))
    prompt = dataclasses.replace(item.prompt, extras=pack(item.prompt.extras))
    upstream = item.upstream
    if not item.input_complete:  # partial results by value (finished ones are object-store refs)
        upstream = {k: pack_result(v) for k, v in upstream.items()}
    return dataclasses.replace(item, prompt=prompt, upstream=upstream)


def unpack_input(item: Item) -> Item:
    if isinstance(item, StageInput):
        return dataclasses.replace(item, extras=unpack(item.extras))
    if isinstance(item, RoutedDelta):
        return dataclasses.replace(item, piece=unpack_result(item.piece))
    prompt = dataclasses.replace(item.prompt, extras=unpack(item.prompt.extras))
    upstream = item.upstream
    if not item.input_complete:
        upstream = {k: unpack_result(v) for k, v in upstream.items()}
    return dataclasses.replace(item, prompt=prompt, upstream=upstream)


def pack_event(event: StageEvent) -> StageEvent:
    """A step's streamed rows and audio chunk as WireTensors (other events carry none)."""
    if isinstance(event, StageUpdate) and (event.tensors or event.audio is not None):
        return dataclasses.replace(event, tensors=pack(event.tensors), audio=pack(event.audio))
    return event


def unpack_event(event: StageEvent) -> StageEvent:
    if isinstance(event, StageUpdate) and (event.tensors or event.audio is not None):
        return dataclasses.replace(event, tensors=unpack(event.tensors), audio=unpack(event.audio))
    return event
