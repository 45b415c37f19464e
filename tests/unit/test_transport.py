"""torch <-> numpy at the actor boundary: exact round trips, every dtype, nested containers."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from omni.backends.transport import (
    WireTensor,
    light_result,
    pack,
    pack_input,
    pack_result,
    unpack,
    unpack_input,
    unpack_result,
)
from omni.messages import PromptInput, RoutedInput, StageInput, StageResult


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int64])
def test_round_trip_is_exact(dtype):
    tensor = (torch.randn(5, 3) * 100).to(dtype)
    wire = WireTensor.pack(tensor)
    assert isinstance(wire.array, np.ndarray)
    back = pickle.loads(pickle.dumps(wire)).unpack()
    assert back.dtype == dtype and torch.equal(back, tensor)


def test_unpack_copies_unless_asked_not_to():
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    array.flags.writeable = False  # as Ray hands arrays out of the object store
    wire = WireTensor(array, "float32")
    owned = wire.unpack()
    owned[0, 0] = 42.0  # writable, and the "object store" is untouched
    assert array[0, 0] == 0.0
    view = wire.unpack(copy=False)
    assert view.data_ptr() == array.ctypes.data


def test_nested_containers_and_messages():
    t = torch.randn(4, 2)
    nested = {"a": [t, (t, 1)], "b": "text"}
    packed = pack(nested)
    assert isinstance(packed["a"][0], WireTensor) and isinstance(packed["a"][1], tuple)
    back = unpack(packed)
    assert torch.equal(back["a"][1][0], t) and back["b"] == "text"

    result = StageResult("r", "a", [1, 2], [3], "stopped", tensors={"hidden_states": t}, audio=t)
    wire = pack_result(result)
    assert isinstance(wire.tensors["hidden_states"], WireTensor)
    assert torch.equal(unpack_result(wire).audio, t)
    assert light_result(result).tensors == {} and result.tensors  # the original keeps them

    stage_input = StageInput("r", [1, 2], extras={"prompt_embeds": t})
    assert torch.equal(unpack_input(pack_input(stage_input)).extras["prompt_embeds"], t)
    routed = RoutedInput("r", {}, PromptInput("r", [1], extras={"pixels": t}), None)
    wire_routed = pack_input(routed)
    assert isinstance(wire_routed.prompt.extras["pixels"], WireTensor)
    assert torch.equal(unpack_input(wire_routed).prompt.extras["pixels"], t)
