"""StageTurns: which stage steps next where several stages share one thread (the local backend).

First audio goes first: a stage whose next step gives some request its first streamed chunk
(`has_urgent_work`: a vocoder's first chunks, a few codes each) steps ahead of the others.
Otherwise the ready stage with the least stepping time charged so far steps. Turns by time, not
by count, because step lengths differ by orders of magnitude: one vocoder step can take seconds
on a CPU, a talker decode step milliseconds. Taking turns one step each, the talker waited out
every vocoder step and finished its codes 10x later than alone; by time, each ready stage gets an
equal share of the thread, and a stage with short steps waits behind at most one long step.

A stage earns no credit while it has nothing to do: whenever a pick is made, the idle stages are
lifted to the least time charged to a ready one, so one that comes back does not take the thread
over for as long as it was idle.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


class StageTurns:
    def __init__(self, names: Iterable[str]) -> None:
        self.charged_s: dict[str, float] = dict.fromkeys(names, 0.0)

    def pick(self, ready: Sequence[str], urgent: Sequence[str] = ()) -> str | None:
        """The stage to step next among the ready ones (in stage order; ties go to the first),
        or None when none is ready. urgent: the ready stages whose step gives a first chunk."""
        if not ready:
            return None
        floor = min(self.charged_s[name] for name in ready)
        for name, charged in self.charged_s.items():
            if name not in ready and charged < floor:
                self.charged_s[name] = floor
        if urgent:
            return urgent[0]
        return min(ready, key=self.charged_s.__getitem__)

    def charge(self, name: str, seconds: float) -> None:
        """Count a step's wall time against its stage (urgent steps too: the others then catch
        up)."""
        self.charged_s[name] += seconds
