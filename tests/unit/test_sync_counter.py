"""SyncCounter (tests/sync_counter.py) counts every kind of host-waiting call it claims to, on the
CPU, and charges each to the innermost listed component on the stack."""

import numpy as np
import torch

from tests.sync_counter import OTHER, SyncCounter


def _reads(x: torch.Tensor) -> None:
    x[0].item()
    int(x[1])
    bool(x[2] > 0)
    x.tolist()


def _shapes(x: torch.Tensor) -> None:
    x.nonzero()
    x.masked_select(x > 0)
    x[x > 0]
    y = x.clone()
    y[y > 0] = 1.0


def _uploads(x: torch.Tensor) -> None:
    torch.tensor([1, 2, 3])
    x[[0, 1]]


def _quiet(x: torch.Tensor) -> None:
    """What a step may do freely: host arrays, device-side indexing and masking, fills."""
    index = torch.from_numpy(np.array([0, 2]))
    x.index_select(0, index)
    x.masked_fill(x > 0, 0.0)
    torch.where(x > 0, x, x * 2)
    x.argmax()
    x.to(torch.float64)
    x.cpu()


def test_counts_each_kind_and_attributes_it():
    x = torch.randn(8)
    components = {"reads": _reads, "shapes": [_shapes], "uploads": _uploads, "quiet": _quiet}
    for inference in (False, True):
        with torch.inference_mode(inference), SyncCounter(components) as counter:
            _reads(x)
            _shapes(x)
            _uploads(x)
            _quiet(x)
            x.sum().item()  # outside every component
        assert counter.of("reads") == ["scalar read"] * 3 + ["tolist"]
        assert counter.of("shapes") == ["nonzero", "masked_select"] + ["bool-mask indexing"] * 2
        assert counter.of("uploads") == ["tensor from Python data"] * 2
        assert counter.of("quiet") == []
        assert counter.of(OTHER) == ["scalar read"]
    # Restored on exit.
    assert torch.Tensor.tolist is not None and x[:2].tolist() == x[:2].tolist()
    assert counter.of("reads") == ["scalar read"] * 3 + ["tolist"]


def test_innermost_component_wins():
    def outer(x):
        _reads(x)
        x.tolist()

    with SyncCounter({"outer": outer, "reads": _reads}) as counter:
        outer(torch.ones(4))
    assert counter.of("reads") == ["scalar read"] * 3 + ["tolist"]
    assert counter.of("outer") == ["tolist"]


@torch.no_grad()
def _decorated(x: torch.Tensor) -> None:
    x.tolist()


@torch.no_grad()
def _other_decorated(x: torch.Tensor) -> None:
    x.tolist()


def test_a_decorated_component_claims_its_own_frames_only():
    """torch.no_grad's wrapper code is shared by every decorated function: a component listed
    decorated is keyed by its own code, so another decorated function's calls are not its."""
    x = torch.arange(3.0)
    with SyncCounter({"mine": [_decorated]}) as counter:
        _decorated(x)
        _other_decorated(x)
        torch.tensor([])  # empty: nothing to copy
    assert counter.of("mine") == ["tolist"]
    assert counter.of(OTHER) == ["tolist"]
