"""LogprobCursor (omni/entrypoints/openai/logprobs.py): OpenAI's two logprobs shapes from a
request's snapshots, each token listed once, the stopping token left out, -inf floored."""

from __future__ import annotations

from omni.core.logprobs import TokenLogprobs
from omni.entrypoints.openai.logprobs import FLOOR, LogprobCursor
from omni.messages import OmniOutput, StageResult


class _Texts:
    """token_texts of a vocabulary where token i reads "t{i}" (a test double)."""

    def token_texts(self, stage: str, token_ids: list[int]) -> list[tuple[str, list[int]]]:
        assert stage == "llm"
        return [(f"t{i}", list(f"t{i}".encode())) for i in token_ids]


def _snapshot(token_ids: list[int], finish: str | None) -> OmniOutput:
    entries = [TokenLogprobs(-0.5 * t, ((t, -0.5 * t), (t + 1, float("-inf")))) for t in token_ids]
    result = StageResult("r", "llm", [1], token_ids, finish, logprobs=entries)
    return OmniOutput("r", {"llm": result}, result, finished=finish is not None)


def test_chat_entries_come_once_each_and_the_stop_token_is_left_out():
    cursor = LogprobCursor(_Texts(), "llm", chat=True)
    first = cursor.new(_snapshot([4, 5], None))
    assert first is not None and first["refusal"] is None
    assert [c["token"] for c in first["content"]] == ["t4", "t5"]
    assert first["content"][0] == {
        "token": "t4", "logprob": -2.0, "bytes": [116, 52],
        "top_logprobs": [{"token": "t4", "logprob": -2.0, "bytes": [116, 52]},
                         {"token": "t5", "logprob": FLOOR, "bytes": [116, 53]}],
    }  # fmt: skip
    assert cursor.new(_snapshot([4, 5], None)) == {"content": [], "refusal": None}
    last = cursor.new(_snapshot([4, 5, 6, 2], "stopped"))  # 2: the EOS that stopped it
    assert last is not None and [c["token"] for c in last["content"]] == ["t6"]
    length = LogprobCursor(_Texts(), "llm", chat=True).new(_snapshot([4, 2], "length"))
    assert length is not None and [c["token"] for c in length["content"]] == ["t4", "t2"]


def test_completion_offsets_continue_across_chunks():
    cursor = LogprobCursor(_Texts(), "llm", chat=False)
    first = cursor.new(_snapshot([7], None))
    second = cursor.new(_snapshot([7, 12, 3], "length"))
    assert first == {"tokens": ["t7"], "token_logprobs": [-3.5], "text_offset": [0],
                     "top_logprobs": [{"t7": -3.5, "t8": FLOOR}]}  # fmt: skip
    assert second is not None and second["tokens"] == ["t12", "t3"]
    assert second["text_offset"] == [2, 5]


def test_no_logprobs_asked_gives_none():
    result = StageResult("r", "llm", [1], [4], "length")
    out = OmniOutput("r", {"llm": result}, result)
    assert LogprobCursor(_Texts(), "llm", chat=True).new(out) is None
    assert LogprobCursor(_Texts(), "other", chat=False).new(out) is None
