"""Sampler: greedy, filters, and per-request seeds independent of the batch."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from omni.core.sampling_params import SamplingParams
from omni.runtime.sampler import TOP_K_CAP, Sampler
from tests.sync_counter import SyncCounter


def logits(rows=4, vocab=50, seed=0):
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 3


def test_greedy_is_argmax():
    x = logits()
    assert Sampler()(x, [SamplingParams()] * 4, [0] * 4) == x.argmax(-1).tolist()


def test_tiny_temperature_is_greedy():
    """1e-40 used to divide the logits into inf/NaN, and argmax over NaN gave token 0 each step."""
    x = logits(rows=6)
    assert x.argmax(-1).tolist() != [0] * 6
    for temperature in (1e-40, 1e-30, 1e-6, 9.9e-6):
        params = [SamplingParams(temperature=temperature, top_k=5, top_p=0.9, seed=3)] * 3
        params += [SamplingParams(temperature=temperature)] * 3
        got = Sampler()(x, params, list(range(6)))
        assert got == x.argmax(-1).tolist(), temperature
    # Mixed with sampled rows in one batch: the tiny-temperature rows stay the argmax.
    mixed = [SamplingParams(temperature=1e-40), SamplingParams(temperature=1.0, seed=1)] * 3
    got = Sampler()(x, mixed, [0] * 6)
    assert got[0::2] == x.argmax(-1)[0::2].tolist()


def test_seeded_row_is_independent_of_the_batch():
    x = logits(rows=6)
    seeded = SamplingParams(temperature=1.0, seed=1234)
    alone = Sampler(seed=1)(x[2:3], [seeded], [5])
    mixed_params = (
        [SamplingParams(temperature=0.7)] * 2
        + [seeded]
        + [SamplingParams(temperature=1.3, seed=9)] * 3
    )
    together = Sampler(seed=2)(x, mixed_params, [0, 1, 5, 2, 3, 4])
    assert together[2] == alone[0]
    # A different output index gives an independent draw stream.
    draws = {Sampler()(x[2:3], [seeded], [n])[0] for n in range(40)}
    assert len(draws) > 1


def test_top_k_and_top_p_restrict_the_support():
    x = torch.tensor([[5.0, 4.0, 3.0, -10.0, -10.0]]).repeat(200, 1)
    top_k = Sampler()(x, [SamplingParams(temperature=5.0, top_k=2)] * 200, [0] * 200)
    assert set(top_k) <= {0, 1} and len(set(top_k)) == 2
    # softmax(5,4,3) = .665, .245, .090: top_p 0.8 keeps tokens 0 and 1 only.
    top_p = Sampler()(x, [SamplingParams(temperature=1.0, top_p=0.8)] * 200, [0] * 200)
    assert set(top_p) <= {0, 1} and len(set(top_p)) == 2


def test_top_k_and_top_p_together_count_the_mass_after_top_k():
    """One sort (or topk) serves both filters, and top-p's mass is the top-k's renormalised (as
    transformers' warpers apply them): top_k 2 keeps 5.0 and 4.5 (.62, .38), so top_p 0.5 keeps
    token 0 alone; counted over the whole row (.42, .26, ...) it would keep token 4 as well."""
    x = torch.tensor([[5.0, 4.0, 3.0, -10.0, 4.5]]).repeat(300, 1)
    both = SamplingParams(temperature=1.0, top_k=2, top_p=0.5)
    assert set(Sampler(seed=1)(x, [both] * 300, [0] * 300)) == {0}
    # top_k 3 (.51, .31, .19): top_p 0.9 keeps all three.
    wider = SamplingParams(temperature=1.0, top_k=3, top_p=0.9)
    assert set(Sampler(seed=1)(x, [wider] * 300, [0] * 300)) == {0, 4, 1}


@pytest.mark.parametrize("top_k", [2, TOP_K_CAP + 1])
def test_top_k_follows_the_distribution(top_k):
    """Through topk (top_k <= TOP_K_CAP) or a sort of the whole row: the top-k renormalised."""
    vocab = TOP_K_CAP + 8
    probs = torch.full((vocab,), 1e-9)
    probs[:3] = torch.tensor([0.5, 0.3, 0.2])
    x = probs.log().repeat(4000, 1)
    params = [SamplingParams(temperature=1.0, top_k=top_k)] * 4000
    draws = torch.tensor(Sampler(seed=5)(x, params, [0] * 4000))
    expected = probs[:3] / (probs[:3].sum() if top_k > 3 else probs[:2].sum())
    expected[2:] = expected[2:] if top_k > 3 else 0.0
    freq = torch.bincount(draws, minlength=vocab).float()[:3] / 4000
    assert torch.allclose(freq, expected, atol=0.03) and int(draws.max()) < 3


def test_a_seeded_row_draws_the_same_whatever_rows_share_its_batch():
    """Rows are grouped by their own parameters (topk of TOP_K_CAP columns, a sort of the
    vocabulary, the plain row), so a seeded row computes the same alone, beside rows of other
    groups, beside rows of its group with other top_k, and among greedy rows."""
    x = logits(rows=5, vocab=400, seed=3)
    seeded = SamplingParams(temperature=2.0, top_k=40, top_p=0.95, seed=77)
    neighbours = [
        [SamplingParams(temperature=1.0, top_p=0.9)],  # sorted
        [SamplingParams(temperature=0.5, top_k=TOP_K_CAP)],  # top, another k
        [SamplingParams(temperature=1.0), SamplingParams(top_k=3, seed=5, temperature=1.0)],
    ]
    greedy = [SamplingParams()] * 4  # few rows sample: topk of theirs alone
    draws = set()
    for n in range(20):
        alone = Sampler()(x[:1], [seeded], [n])[0]
        for others in neighbours:
            rows = len(others) + 1
            assert Sampler()(x[:rows], [seeded, *others], [n] + [0] * len(others))[0] == alone
        among_greedy = Sampler()(x[[1, 2, 3, 4, 0]], [*greedy, seeded], [0, 0, 0, 0, n])[4]
        assert among_greedy == alone, n
        draws.add(alone)
    assert len(draws) > 3  # the draws do differ by output index


def test_sorted_ties_go_by_token_id_and_top_p_one_cuts_nothing():
    """The sorted group (top_k past TOP_K_CAP): with every logit tied, its top-k is the lowest
    token ids (a stable sort), and top_p 1 keeps all of them."""
    x = torch.zeros(3000, TOP_K_CAP + 10)
    params = [SamplingParams(temperature=1.0, top_k=TOP_K_CAP + 1, top_p=1.0)] * 3000
    draws = set(Sampler(seed=4)(x, params, [0] * 3000))
    assert max(draws) <= TOP_K_CAP and len(draws) > 0.9 * (TOP_K_CAP + 1)


def test_top_group_ties_go_by_token_id_whatever_the_dtype():
    """bf16 logits tie often; a penalized neighbour turns the batch's logits into float32. A
    top-k row's candidates are ordered by logit, then token id, either way: top_k 1 takes the
    lowest id among the largest, and a seeded row draws the same beside a penalized one."""
    x = torch.zeros(2, 600, dtype=torch.bfloat16)
    x[:, [500, 7, 300]] = 5.0  # tied largest
    x[:, 40:60] = 4.0
    top_1 = SamplingParams(temperature=1.0, top_k=1)
    assert Sampler()(x, [top_1, top_1], [0, 0]) == [7, 7]
    seeded = SamplingParams(temperature=2.0, top_k=30, seed=9)
    penalized = SamplingParams(presence_penalty=1.0)
    for n in range(10):
        alone = Sampler()(x[:1], [seeded], [n])[0]
        assert Sampler()(x, [seeded, penalized], [n, 0], adjusted=["s", "p"])[0] == alone, n


def test_sampling_follows_the_distribution():
    probs = torch.tensor([0.5, 0.3, 0.2])
    x = probs.log().repeat(4000, 1)
    draws = torch.tensor(Sampler(seed=3)(x, [SamplingParams(temperature=1.0)] * 4000, [0] * 4000))
    freq = torch.bincount(draws, minlength=3).float() / 4000
    assert torch.allclose(freq, probs, atol=0.03)


@pytest.mark.parametrize("extra", [{}, {"top_k": 6}, {"top_k": TOP_K_CAP + 1}, {"top_p": 0.99}])
def test_min_p_keeps_what_transformers_min_p_warper_keeps(extra):
    """In every group (plain, topk, sorted): the draws' support is the tokens transformers'
    temperature and min-p warpers keep, and their frequencies follow the kept mass."""
    from transformers import MinPLogitsWarper, TemperatureLogitsWarper

    vocab = TOP_K_CAP + 8
    probs = torch.full((vocab,), 1e-9)
    probs[:6] = torch.tensor([0.34, 0.3, 0.2, 0.06, 0.05, 0.05])
    x = probs.log().repeat(4000, 1)
    params = SamplingParams(temperature=0.8, min_p=0.25, **extra)
    warped = MinPLogitsWarper(0.25)(None, TemperatureLogitsWarper(0.8)(None, x[:1].clone()))
    kept = warped[0].isfinite()
    assert kept.sum() == 3  # 0.06 ** 1.25 / 0.34 ** 1.25 < 0.25: tokens 3..5 go
    draws = torch.tensor(Sampler(seed=4)(x, [params] * 4000, [0] * 4000))
    assert set(draws.tolist()) == set(kept.nonzero()[:, 0].tolist())
    expected = warped[0].softmax(-1)[:3]
    assert torch.allclose(
        torch.bincount(draws, minlength=3).float()[:3] / 4000, expected, atol=0.03
    )
    seeded = SamplingParams(temperature=0.8, min_p=0.25, seed=3, **extra)
    assert set(Sampler()(x[:200], [seeded] * 200, list(range(200)))) <= {0, 1, 2}
    greedy = Sampler()(x[:2], [SamplingParams(min_p=0.9)] * 2, [0, 0])
    assert greedy == [0, 0]  # the most likely token is never cut


def test_the_ids_copy_is_the_only_host_sync():
    """Greedy, unseeded and seeded rows with top-k and top-p in one batch: the per-row vectors
    go over in one upload from host arrays, so the chosen ids' .tolist() is the only call that
    would make the host wait for a GPU."""
    x = logits(rows=6)
    params = [
        SamplingParams(),
        SamplingParams(temperature=0.7),
        SamplingParams(temperature=1.0, seed=3, top_k=5, top_p=0.9),
    ] * 2
    for inference in (False, True):
        with torch.inference_mode(inference), SyncCounter({"sampler": Sampler.__call__}) as c:
            Sampler()(x, params, [0] * 6)
        assert c.of("sampler") == ["tolist"]


class _Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append((func, tuple(args[0].shape) if args else None))
        return func(*args, **(kwargs or {}))


def test_greedy_rows_take_the_argmax_of_the_logits_as_they_are():
    """bfloat16 logits, greedy only: no float32 copy of the logits (the argmax is exact in
    bfloat16), and a tie goes to the first index as in float32."""
    x = logits(rows=5, vocab=300).bfloat16()
    x[3, 7] = x[3, 9] = x[3].max() + 1  # a tie
    with _Ops() as seen:
        got = Sampler()(x, [SamplingParams()] * 5, [0] * 5)
    assert got == x.float().argmax(-1).tolist() and got[3] == 7
    assert [f for f, _ in seen.ops] == [torch.ops.aten.argmax.default]
    # Mixed: only the two random rows are converted, and their noise is one draw.
    mixed = [SamplingParams(), SamplingParams(temperature=1.0)] * 2 + [SamplingParams()]
    with _Ops() as seen:
        Sampler()(x, mixed, [0] * 5)
    copies = [shape for f, shape in seen.ops if f == torch.ops.aten._to_copy.default]
    draws = [shape for f, shape in seen.ops if f == torch.ops.aten.uniform_.default]
    assert copies == [(2, 300)] and draws == [(2, 300)]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"temperature": -0.1}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"presence_penalty": 3}, "presence_penalty"),
        ({"frequency_penalty": -2.5}, "frequency_penalty"),
        ({"logit_bias": {1: 101}}, "logit_bias"),
        ({"logit_bias": {"x": 1}}, "logit_bias"),
        ({"logit_bias": 5}, "logit_bias"),
    ],
)
def test_bad_sampling_params(kwargs, field):
    with pytest.raises(ValueError, match=f"SamplingParams.{field} must be"):
        SamplingParams(**kwargs)
