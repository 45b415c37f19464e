"""StageTurns: urgent stages first, then the least stepping time; idle stages bank no credit.
And the local backend's policy for which stages step on a thread of their own."""

from omni.backends.stage_turns import StageTurns


def test_nothing_ready():
    assert StageTurns(["thinker", "talker"]).pick([]) is None


def test_least_time_first_ties_in_stage_order():
    turns = StageTurns(["thinker", "talker", "token2wav"])
    assert turns.pick(["thinker", "talker", "token2wav"]) == "thinker"
    turns.charge("thinker", 0.01)
    assert turns.pick(["thinker", "talker", "token2wav"]) == "talker"
    turns.charge("talker", 0.01)
    assert turns.pick(["thinker", "talker", "token2wav"]) == "token2wav"


def test_short_steps_catch_up_after_a_long_one():
    """After a 2 s vocoder step the talker takes its 0.25 s steps until it has had as much (a
    tie goes to the talker, first in stage order), then the vocoder steps again. Binary
    fractions: the sums are exact."""
    turns = StageTurns(["talker", "token2wav"])
    turns.charge("token2wav", 2.0)
    picks = []
    for _ in range(20):
        name = turns.pick(["talker", "token2wav"])
        assert name is not None
        picks.append(name)
        turns.charge(name, 2.0 if name == "token2wav" else 0.25)
    assert picks[:10] == ["talker"] * 9 + ["token2wav"]
    assert picks[10:] == ["talker"] * 8 + ["token2wav", "talker"]  # 4.0 ties 4.0: talker


def test_urgent_goes_first_and_is_charged():
    turns = StageTurns(["talker", "token2wav"])
    turns.charge("token2wav", 5.0)
    assert turns.pick(["talker", "token2wav"], urgent=["token2wav"]) == "token2wav"
    turns.charge("token2wav", 1.0)
    assert turns.pick(["talker", "token2wav"]) == "talker"
    assert turns.charged_s["token2wav"] == 6.0


def test_idle_stages_bank_no_credit():
    turns = StageTurns(["thinker", "talker", "token2wav"])
    for _ in range(10):  # the talker alone works for 10 s; the others have nothing to do
        assert turns.pick(["talker"]) == "talker"
        turns.charge("talker", 1.0)
    assert turns.pick(["talker"]) == "talker"  # lifts the idle ones to the talker's 10 s
    assert turns.charged_s == {"thinker": 10.0, "talker": 10.0, "token2wav": 10.0}
    turns.charge("talker", 0.5)
    # The thinker comes back: it gets the next turn, but not 10 s of them in a row.
    assert turns.pick(["thinker", "talker"]) == "thinker"
    turns.charge("thinker", 1.0)
    assert turns.pick(["thinker", "talker"]) == "talker"


def test_which_stages_get_a_thread_of_their_own():
    """The local backend's policy, on each stage's resolved device: auto gives GPU stages their
    own thread and keeps CPU stages on the shared one."""
    from omni.backends.local import own_thread

    assert own_thread("auto", "cuda") and not own_thread("auto", "cpu")
    assert own_thread("per_stage", "cpu") and own_thread("per_stage", "cuda")
    assert not own_thread("shared", "cuda") and not own_thread("shared", "cpu")
