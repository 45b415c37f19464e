"""Prefix-cache hit statistics: totals and a window over the most recent requests."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass
class PrefixCacheStats:
    requests: int = 0
    """Requests looked up (a preempted request counts again when it is rescheduled)."""
    queries: int = 0
    """Tokens looked up."""
    hits: int = 0
    """Tokens served from cached blocks."""
    window: int = 1000
    """How many recent requests `recent_hit_rate` covers."""
    _recent: deque[tuple[int, int]] = field(default_factory=deque, repr=False)

    def record(self, num_queried_tokens: int, num_hit_tokens: int) -> None:
        self.requests += 1
        self.queries += num_queried_tokens
        self.hits += num_hit_tokens
        self._recent.append((num_queried_tokens, num_hit_tokens))
        if len(self._recent) > self.window:
            self._recent.popleft()

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0

    @property
    def recent_hit_rate(self) -> float:
        queries = sum(q for q, _ in self._recent)
        return sum(h for _, h in self._recent) / queries if queries else 0.0

    def as_dict(self) -> dict[str, float]:
        return {
            "requests": self.requests,
            "queried_tokens": self.queries,
            "hit_tokens": self.hits,
            "hit_rate": round(self.hit_rate, 4),
            "recent_hit_rate": round(self.recent_hit_rate, 4),
        }
