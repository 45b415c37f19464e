"""One compiled attention kernel per stage, whatever the step: Triton compiles a variant for each
specialization of its arguments (an integer equal to 1 or a multiple of 16, a pointer 16-byte
aligned or not), hundreds of milliseconds each on a GPU. Steps of any batch composition, their
index tensors at any address, give the kernel the same specialization key here; and a step's
upload puts every array at a 16-byte offset (omni/runtime/host_upload.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import kernels.triton_paged_attention as tpa
from omni.runtime.host_upload import layout

triton = pytest.importorskip("triton")
libtriton = pytest.importorskip("triton._C.libtriton")
BaseBackend = pytest.importorskip("triton.backends.compiler").BaseBackend


def _shifted(t: torch.Tensor) -> torch.Tensor:
    """t's values at an address 8 bytes past a 16-byte boundary (as a view into an upload
    packed at 8-byte offsets would be)."""
    buffer = torch.empty(t.numel() + 1, dtype=t.dtype)
    view = buffer[1:].view(t.shape)
    view.copy_(t)
    assert view.data_ptr() % 16 == 8
    return view


def _step(num_seqs: int, num_tokens: int, shift: bool) -> dict:
    heads, kv_heads, dim, block_size = 4, 2, 16, 4
    q_lens = [num_tokens - (num_seqs - 1)] + [1] * (num_seqs - 1)
    starts = torch.tensor(np.concatenate([[0], np.cumsum(q_lens)]), dtype=torch.int64)
    index = {
        "block_tables": torch.zeros(num_seqs, 9, dtype=torch.int64),
        "seq_lens": torch.tensor(q_lens, dtype=torch.int64) + 5,
        "query_start_loc": starts,
    }
    if shift:
        index = {name: _shifted(t) for name, t in index.items()}
    cache = torch.zeros(8, block_size, kv_heads, dim)
    return dict(
        query=torch.zeros(num_tokens, heads, dim), key_cache=cache, value_cache=cache, **index
    )


def _key(monkeypatch, step: dict, align_everything: bool = False) -> tuple:
    """The specialization Triton's binder computes from the positional arguments of the launch
    (the constexprs, passed by keyword, are the same for every decode or prefill step)."""
    launched = []
    monkeypatch.setattr(tpa, "launch", lambda kernel, grid, device, *a, **kw: launched.append(a))
    tpa.triton_paged_attention(**step, scale=0.25)
    (args,) = launched
    key = []
    for param, arg in zip(tpa._kernel.params, args, strict=False):
        align = align_everything or not param.do_not_specialize_on_alignment
        specialize = not param.do_not_specialize
        key.append(libtriton.native_specialize_impl(BaseBackend, arg, False, specialize, align))
    return tuple(map(str, key))


@pytest.mark.parametrize("kind", ["decode", "prefill"])
def test_every_step_composition_shares_one_specialization(monkeypatch, kind):
    sizes = [(1, 1), (2, 2), (3, 3), (16, 16), (17, 17)]  # decode: one token per sequence
    if kind == "prefill":
        sizes = [(1, 2), (2, 9), (3, 16), (16, 40), (17, 33)]
    steps = [_step(s, t, shift) for s, t in sizes for shift in (False, True)]
    keys = {_key(monkeypatch, step) for step in steps}
    assert len(keys) == 1, keys
    # What the flags prevent: with every pointer's alignment specialized, the shifted views make
    # a second variant (and the integers alone, a third: 1, multiples of 16, the rest).
    aligned = {_key(monkeypatch, step, align_everything=True) for step in steps}
    assert len(aligned) == 2


def test_upload_places_every_array_16_byte_aligned():
    gen = np.random.default_rng(0)
    for _ in range(50):
        sizes, dtypes = gen.integers(0, 40, size=7), gen.choice([np.int64, np.int32, np.bool_], 7)
        arrays = [np.zeros(int(n), dtype=d) for n, d in zip(sizes, dtypes, strict=True)]
        offsets, size = layout(arrays)
        assert all(offset % 16 == 0 for offset in offsets)
        ends = [o + a.nbytes for o, a in zip(offsets, arrays, strict=True)]
        assert all(end <= nxt for end, nxt in zip(ends, offsets[1:], strict=False))
        assert size >= ends[-1]
