"""SeenCodes (stages/qwen2_5_omni/talker_penalty.py): the device seen-mask penalty equals
transformers' RepetitionPenaltyLogitsProcessor bit for bit, per row, with two penalty values
and rows without a penalty in one batch; released rows come back cleared."""

import torch
from transformers import RepetitionPenaltyLogitsProcessor

from stages.qwen2_5_omni.talker_penalty import SeenCodes

VOCAB = 40


def test_penalty_equals_transformers():
    gen = torch.Generator().manual_seed(0)
    seen = SeenCodes(VOCAB, torch.device("cpu"))
    histories = {
        "a": [3, 3, 7, 39, 0],
        "b": [1, 2, 5],
        "c": list(range(0, VOCAB, 3)),
    }
    penalties = {"a": 1.05, "b": 1.3, "c": 1.05}
    for key, ids in histories.items():
        slot = seen.slot(key)
        seen.mark(torch.tensor([slot] * len(ids)), torch.tensor(ids))
    rows = ["a", None, "b", "c"]  # None: a row without a penalty
    logits = torch.randn(len(rows), VOCAB, generator=gen) * 4
    logits[:, 5] = float("-inf")
    slots = torch.tensor([seen.slot(k) if k else 0 for k in rows])
    values = [1.05, 1.3]
    groups = torch.tensor([values.index(penalties[k]) if k else 0 for k in rows])
    got = seen.penalize(logits.clone(), slots, groups, values)
    for row, key in enumerate(rows):
        want = logits[row : row + 1].clone()
        if key is not None:
            processor = RepetitionPenaltyLogitsProcessor(penalties[key])
            want = processor(torch.tensor([histories[key]]), want)
        assert torch.equal(got[row], want[0]), key
    # One penalty value: the same result without the group masks.
    only = seen.penalize(logits[[0, 3]].clone(), slots[[0, 3]], groups[[0, 3]], [1.05])
    assert torch.equal(only, got[[0, 3]])


def test_released_rows_are_reused_cleared_and_the_table_grows():
    seen = SeenCodes(VOCAB, torch.device("cpu"))
    slots = {f"k{i}": seen.slot(f"k{i}") for i in range(40)}  # more than the first table
    assert len(set(slots.values())) == 40 and 0 not in slots.values()
    seen.mark(torch.tensor(list(slots.values())), torch.tensor([i % VOCAB for i in range(40)]))
    seen.release("k3")
    again = seen.slot("new")
    assert again == slots["k3"] and not seen.rows[again].any()
    assert seen.rows[slots["k4"], 4] and not seen.rows[0].any()
