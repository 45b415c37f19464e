"""Per-request sampling settings (torch-free, validated on construction)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class SamplingParams:
    """How one stage samples and when it stops for one request."""

    max_tokens: int = 16
    """Maximum number of tokens to generate (>= 1)."""
    temperature: float = 0.0
    """0 means greedy; otherwise logits are divided by it before sampling."""
    top_p: float = 1.0
    """Nucleus sampling mass in (0, 1]."""
    top_k: int = 0
    """Keep only the k most likely tokens; 0 disables."""
    seed: int | None = None
    """Per-request seed: the same seed gives the same tokens whatever else is in the batch."""
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)
    """Generation stops after any of these tokens (in addition to EOS)."""
    ignore_eos: bool = False
    """Keep generating after the model's EOS token."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        _check(
            isinstance(self.max_tokens, int) and self.max_tokens >= 1,
            "max_tokens",
            self.max_tokens,
            "an integer >= 1",
        )
        _check(self.temperature >= 0, "temperature", self.temperature, ">= 0")
        _check(0 < self.top_p <= 1, "top_p", self.top_p, "in (0, 1]")
        _check(
            isinstance(self.top_k, int) and self.top_k >= 0, "top_k", self.top_k, "an integer >= 0"
        )
        _check(
            self.seed is None or isinstance(self.seed, int), "seed", self.seed, "an integer or None"
        )
        for token_id in self.stop_token_ids:
            _check(
                isinstance(token_id, int) and token_id >= 0,
                "stop_token_ids",
                self.stop_token_ids,
                "non-negative integers",
            )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def _check(ok: bool, name: str, value: object, expected: str) -> None:
    if not ok:
        raise ValueError(f"SamplingParams.{name} must be {expected}, got {value!r}")
