"""Split-KV (kernels/split_kv.py): the Triton attention with its keys split over programs and the
partials combined equals the torch reference, for every batch kind, with empty splits (contexts
shorter than the splits), poisoned partial buffers and any split count; and the host's choice of
split count follows the grid, the context bound and the SM count alone.

Without a GPU the kernels run under Triton's interpreter (as test_triton_paged_attention.py)."""

import pytest
import torch
from test_triton_paged_attention import BATCHES, DEVICE, check, cpu_only, make_batch

triton = pytest.importorskip("triton")

from kernels import split_kv  # noqa: E402
from kernels.triton_paged_attention import triton_paged_attention  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# Contexts long enough for several MIN_SHARE (256-key) shares, and short ones beside them.
LONG_DECODE = [(1, 700), (1, 17), (1, 300), (1, 1)]
LONG_SUFFIX = [(16, 1100)]  # a short suffix after a long cached prefix
LONG_MIXED = [(20, 600), (0, 9), (1, 513), (5, 5), (1, 257)]


@pytest.mark.parametrize("num_splits", [2, 3, 8])
@pytest.mark.parametrize("batch", ["long_decode", "long_suffix", "long_mixed"])
def test_split_equals_reference(batch, num_splits):
    specs = {"long_decode": LONG_DECODE, "long_suffix": LONG_SUFFIX, "long_mixed": LONG_MIXED}
    check(specs[batch], num_splits=num_splits)


def test_as_many_splits_as_the_cap():
    """MAX_SPLITS splits of a 1,116-key context: 5 shares of MIN_SHARE keys, the rest empty."""
    check(LONG_SUFFIX, num_splits=split_kv.MAX_SPLITS)


@pytest.mark.parametrize("batch", ["decode", "mixed", "empty_query"])
def test_short_contexts_leave_later_splits_empty(batch):
    """Every context under one share: splits 1.. are empty (weight 0 in the combine)."""
    check(BATCHES[batch], num_splits=4)


@pytest.mark.parametrize(
    ("heads", "head_dim", "block_size"), [((14, 2), 64, 16), ((28, 4), 80, 8), ((8, 8), 32, 32)]
)
def test_split_with_groups_head_dims_and_block_sizes(heads, head_dim, block_size):
    check(LONG_MIXED, heads=heads, head_dim=head_dim, block_size=block_size, num_splits=3)


def test_split_in_half_precision():
    check(LONG_DECODE, dtype=torch.bfloat16, heads=(8, 2), num_splits=4)


def test_poisoned_partials_and_one_pair_of_buffers_per_step():
    """NaN in the step's partial buffers before the launch: every (split, token, head) entry
    is written, empty splits' too. The layers of a step share the buffers."""
    tensors, reference = make_batch(LONG_MIXED, 16, 4, 2, 64, torch.float32, 0, DEVICE)
    num_tokens = tensors["query"].shape[0]
    poison = (
        torch.full((4, num_tokens, 4, 64), float("nan"), device=DEVICE),
        torch.full((4, num_tokens, 4), float("nan"), device=DEVICE),
    )
    step_cache = {("split_kv", 4): poison}
    for _ in range(2):  # two layers of one step
        out = triton_paged_attention(scale=0.125, **tensors, num_splits=4, step_cache=step_cache)
        torch.testing.assert_close(out.cpu(), reference, atol=1e-5, rtol=1e-5)
    assert step_cache[("split_kv", 4)] is poison


def test_unsplit_launch_writes_no_partials(monkeypatch):
    """One split given, or no SM count known (the CPU): one launch, no combine."""
    called = []
    monkeypatch.setattr(split_kv, "combine_splits", lambda *a: called.append(a))
    check(LONG_DECODE, num_splits=1)
    monkeypatch.setattr(split_kv, "num_sms", lambda device: 0)
    check(LONG_DECODE, max_context=700)
    assert called == []


@pytest.mark.parametrize(
    ("num_programs", "max_context", "num_sms", "expected"),
    [
        (2, 8192, 132, 32),  # one decode sequence, 2 kv heads: capped at MAX_SPLITS
        (2, 4096, 132, 16),  # ... capped by the context: 256 keys per split at least
        (32, 8192, 132, 9),  # 16 sequences: 2 programs per SM
        (6, 4352, 132, 17),  # a 16-token suffix graph of the 0.5B layout
        (132, 8192, 132, 1),  # the grid fills the GPU already
        (2, 300, 132, 1),  # a context of about one share
        (2, None, 132, 1),  # no bound known on the host
        (2, 8192, 0, 1),  # not a CUDA device
    ],
)
def test_split_count_choice(num_programs, max_context, num_sms, expected):
    assert split_kv.num_kv_splits(num_programs, max_context, num_sms) == expected


@cpu_only
def test_hook_splits_with_the_steps_context_bound(monkeypatch):
    """Through the registered hook on a GPU-sized SM count: the metadata's max_context (the
    step's longest sequence) makes the kernel split, with the torch path's result."""
    from test_triton_paged_attention import _hook_step

    from omni.runtime import attention

    _, expected = _hook_step("cpu", torch.float32)
    monkeypatch.setattr(attention, "uses_triton", lambda device: True)
    monkeypatch.setattr(split_kv, "num_sms", lambda device: 132)
    monkeypatch.setattr(split_kv, "MIN_SHARE", 16)  # the step's contexts are 3 to 40 keys
    combined = []
    combine = split_kv.combine_splits
    monkeypatch.setattr(
        split_kv, "combine_splits", lambda *a: combined.append(a[0].shape[0]) or combine(*a)
    )
    meta, got = _hook_step("cpu", torch.float32)
    assert meta.max_context == 40 and combined == [2, 2]  # 40 keys / 16 per share; 2 layers
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


@cpu_only
def test_combine_compiles_for_sm90_without_a_gpu():
    """The combine kernel through the real compiler (the interpreter checks no types)."""
    import inspect

    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = list(inspect.signature(split_kv._combine_kernel).parameters)
    constexprs = dict(NUM_HEADS=28, HEAD_DIM=80, HEAD_DIM_PAD=128)
    pointers = {"part_out_ptr": "*fp32", "part_lse_ptr": "*fp32", "out_ptr": "*bf16"}
    signature = {n: "constexpr" if n in constexprs else pointers.get(n, "i32") for n in names}
    source = ASTSource(
        split_kv._combine,
        signature,
        constexprs={(names.index(k),): v for k, v in constexprs.items()},
    )
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    assert compiled.asm["cubin"]


@pytest.mark.cuda
@pytest.mark.parametrize("heads", [(14, 2), (28, 4)])
def test_cuda_split_bf16_and_default_choice(heads):
    """Compiled: an explicit split in bf16, and the default choice on this GPU's SM count (a
    single long decode sequence splits) against the float32 oracle."""
    check(LONG_DECODE, heads=heads, head_dim=128, dtype=torch.bfloat16, num_splits=6)
    check([(1, 2000)], heads=heads, head_dim=128, dtype=torch.bfloat16, max_context=2000)
    assert split_kv.num_kv_splits(heads[1], 2000, split_kv.num_sms(torch.device("cuda"))) > 1


@cpu_only
def test_warm_up_compiles_the_split_path(qwen2_dir, monkeypatch):
    """The warm-up's 1-token step is bound to max_model_len: with graphs off, a GPU compiles
    the split path (the combine kernel) at start-up, not on the first long request."""
    from helpers import make_engine

    from omni.runtime import attention

    monkeypatch.setattr(attention, "uses_triton", lambda device: True)
    monkeypatch.setattr(split_kv, "num_sms", lambda device: 132)
    combined = []
    combine = split_kv.combine_splits
    monkeypatch.setattr(
        split_kv, "combine_splits", lambda *a: combined.append(a[0].shape[0]) or combine(*a)
    )
    make_engine(qwen2_dir, device="cpu", block_size=16, max_model_len=1024)
    assert combined and min(combined) > 1  # the 1-token step, every layer
