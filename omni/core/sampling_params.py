"""Per-request sampling settings (torch-free, validated on construction)."""

from __future__ import annotations

import functools
import json
import math
import numbers
import operator
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, SupportsIndex, cast

from omni.core.json_schema import compile_schema
from omni.core.logprobs import MAX_LOGPROBS

GREEDY_BELOW = 1e-5
"""Temperatures below this (0 included) sample greedily, as in vLLM: logits divided by a tiny
temperature overflow float32 (1e-40 made every row NaN, and argmax of NaN is token 0)."""


@dataclass(frozen=True)
class SamplingParams:
    """How one stage samples and when it stops for one request.

    Every field is checked on construction: a wrong type or value is a ValueError naming the
    field and the value ("SamplingParams.top_p must be ..., got '0.9' (str)"). A bool is never
    taken for an integer, nor a string for a number; an integer is fine for a float field.
    """

    max_tokens: int | None = 16
    """Maximum number of tokens to generate (>= 1); None: until the end of the stage's context
    (its max_model_len, or the tokens its KV pool holds for one request, if fewer)."""
    temperature: float = 0.0
    """Finite, >= 0. Below 1e-5 (`GREEDY_BELOW`; 0 included) sampling is greedy (argmax);
    otherwise logits are divided by it before sampling."""
    top_p: float = 1.0
    """Nucleus sampling mass in (0, 1]."""
    top_k: int = 0
    """Keep only the k most likely tokens; 0 disables."""
    seed: int | None = None
    """Per-request seed: the same seed gives the same tokens whatever else is in the batch."""
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)
    """Generation stops after any of these tokens (in addition to EOS): a list or tuple of
    non-negative integers."""
    ignore_eos: bool = False
    """Keep generating after the model's EOS token."""
    stop: tuple[str, ...] = field(default_factory=tuple)
    """Stop strings (a string or a list of non-empty ones): generation stops once the text
    contains one, and the text returned ends before it. Matched on the decoded text by the
    driver, so only the request's final stage, when its tokens are text, may set them."""
    include_stop_str_in_output: bool = False
    """As vLLM's: the returned text ends with the stop string that ended it (else before it)."""
    presence_penalty: float = 0.0
    """In [-2, 2], as OpenAI's: subtracted from the logit of every token already generated."""
    frequency_penalty: float = 0.0
    """In [-2, 2], as OpenAI's: subtracted from a token's logit once per time it was generated."""
    logit_bias: tuple[tuple[int, float], ...] = field(default_factory=tuple)
    """As OpenAI's: token id -> a bias in [-100, 100] added to its logit before every choice; a
    dict (ids may be strings of digits, as in JSON) or (id, bias) pairs, kept sorted by id."""
    logprobs: int | None = None
    """Return each sampled token's log-probability (omni/core/logprobs.py) and this many most
    likely alternatives at its position (0 to 20); None returns none."""
    prompt_logprobs: int | None = None
    """The same for each prompt token after the first (given the tokens before it): 0 to 20
    alternatives, None for none. Such a request is prefilled whole (no prefix-cache hits)."""
    repetition_penalty: float = 1.0
    """> 0, as transformers' and vLLM's: the logit of every token in the prompt or generated so
    far is divided by it where positive and multiplied by it where negative; 1 leaves them."""
    min_p: float = 0.0
    """In [0, 1], as vLLM's: a sampled token's probability must be at least min_p times the most
    likely one's (after temperature, top-k and top-p); 0 disables. Greedy rows ignore it."""
    min_tokens: int = 0
    """As vLLM's: the stop tokens (EOS, stop_token_ids) cannot be chosen before this many tokens
    were generated, and stop strings are not looked for in the text of the steps before; at
    most max_tokens."""
    json_schema: str | None = None
    """Constrain the tokens to JSON that follows this JSON schema (its text, or a dict; the
    subset in omni/core/json_schema.py: '{"type": "object"}' is any object; {"x-omni-choice":
    ["yes", "no"]} is one of those texts, as written): only tokens that
    keep the text on the way to such a value are sampled, and stop tokens only once it is whole.
    A schema outside the subset is a ValueError naming where."""

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        if self.max_tokens is not None:
            expected = "an integer >= 1 or None"
            set_(self, "max_tokens", _integer("max_tokens", self.max_tokens, 1, expected))
        temperature = _number("temperature", self.temperature, lambda t: t >= 0, ">= 0")
        set_(self, "temperature", temperature)
        set_(self, "top_p", _number("top_p", self.top_p, lambda p: 0 < p <= 1, "in (0, 1]"))
        set_(self, "top_k", _integer("top_k", self.top_k, 0))
        if self.seed is not None:
            set_(self, "seed", _integer("seed", self.seed, None, "an integer or None"))
        set_(self, "stop_token_ids", _token_ids(self.stop_token_ids))
        set_(self, "stop", _stop_strings(self.stop))
        _check(isinstance(self.ignore_eos, bool), "ignore_eos", self.ignore_eos, "True or False")
        include = self.include_stop_str_in_output
        _check(isinstance(include, bool), "include_stop_str_in_output", include, "True or False")
        set_(self, "logit_bias", _logit_bias(self.logit_bias))
        if self.json_schema is not None:
            set_(self, "json_schema", _json_schema(self.json_schema))
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None:
                expected = f"an integer in [0, {MAX_LOGPROBS}] or None"
                value = _integer(name, value, 0, expected)
                _check(value <= MAX_LOGPROBS, name, value, expected)
                set_(self, name, value)
        for name in ("presence_penalty", "frequency_penalty"):
            set_(
                self, name, _number(name, getattr(self, name), lambda v: -2 <= v <= 2, "in [-2, 2]")
            )
        penalty = _number("repetition_penalty", self.repetition_penalty, lambda v: v > 0, "> 0")
        set_(self, "repetition_penalty", penalty)
        set_(self, "min_p", _number("min_p", self.min_p, lambda v: 0 <= v <= 1, "in [0, 1]"))
        set_(self, "min_tokens", _integer("min_tokens", self.min_tokens, 0))
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(
                f"SamplingParams.min_tokens must be at most max_tokens ({self.max_tokens}), "
                f"got {self.min_tokens}"
            )

    @property
    def penalized(self) -> bool:
        """Whether the tokens seen so far change the logits (presence, frequency, repetition)."""
        return (
            self.presence_penalty != 0
            or self.frequency_penalty != 0
            or self.repetition_penalty != 1
        )

    @property
    def adjusts_logits(self) -> bool:
        """Whether its logits change before it chooses (penalties or a logit bias)."""
        return self.penalized or bool(self.logit_bias)

    @property
    def greedy(self) -> bool:
        """Argmax sampling: temperature below `GREEDY_BELOW` (0 included)."""
        return self.temperature < GREEDY_BELOW


def _integer(name: str, value: object, minimum: int | None, expected: str = "") -> int:
    expected = expected or f"an integer >= {minimum}"
    if isinstance(value, SupportsIndex) and not isinstance(value, bool):
        try:
            number = operator.index(value)
        except TypeError:  # e.g. a numpy array that is not one integer
            pass
        else:
            if minimum is None or number >= minimum:
                return number
    raise ValueError(f"SamplingParams.{name} must be {expected}, got {_show(value)}")


def _number(name: str, value: object, ok: Callable[[float], bool], bounds: str) -> float:
    """A finite float from an int or float (numpy scalars too); never a bool or a string."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        number = float(value)
        if math.isfinite(number) and ok(number):
            return number
    raise ValueError(f"SamplingParams.{name} must be a finite number {bounds}, got {_show(value)}")


def _token_ids(value: object) -> tuple[int, ...]:
    expected = "a list of non-negative integer token ids"
    _check(isinstance(value, list | tuple), "stop_token_ids", value, expected)
    assert isinstance(value, list | tuple)
    ids = []
    for index, token_id in enumerate(value):
        try:
            ids.append(_integer("stop_token_ids", token_id, 0))
        except ValueError:
            raise ValueError(
                f"SamplingParams.stop_token_ids must be {expected}, got {_short(value)}: "
                f"item {index} is {_show(token_id)}"
            ) from None
    return tuple(ids)


def _stop_strings(value: object) -> tuple[str, ...]:
    strings = (value,) if isinstance(value, str) else value
    ok = isinstance(strings, list | tuple) and all(isinstance(s, str) and s for s in strings)
    _check(ok, "stop", value, "a non-empty string or a list of them")
    return tuple(cast(Iterable[str], strings))


def _logit_bias(value: object) -> tuple[tuple[int, float], ...]:
    expected = "a map of token ids to biases in [-100, 100]"
    if isinstance(value, dict):
        pairs: Iterable[Any] = value.items()
    else:
        _check(isinstance(value, list | tuple), "logit_bias", value, expected)
        pairs = cast(Iterable[Any], value)
    out = {}
    for pair in pairs:
        ok = isinstance(pair, list | tuple) and len(pair) == 2
        token_id, bias = tuple(pair) if ok else (None, None)
        if isinstance(token_id, str) and token_id.isdigit():
            token_id = int(token_id)  # JSON object keys are strings
        try:
            out[_integer("logit_bias", token_id, 0)] = _number(
                "logit_bias", bias, lambda b: -100 <= b <= 100, "in [-100, 100]"
            )
        except ValueError:
            raise ValueError(
                f"SamplingParams.logit_bias must be {expected}, got {_short(value)}: "
                f"{_short(token_id)} -> {_show(bias)}"
            ) from None
    return tuple(sorted(out.items()))


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def _show(value: object) -> str:
    return f"{_short(value)} ({type(value).__name__})"


def _check(ok: bool, name: str, value: object, expected: str) -> None:
    if not ok:
        raise ValueError(f"SamplingParams.{name} must be {expected}, got {_show(value)}")


def _json_schema(value: object) -> str:
    """A schema's canonical text (dicts sorted by key); a ValueError naming the field."""
    try:
        text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
        return _canonical_schema(text)
    except (ValueError, TypeError) as e:  # json's errors are ValueErrors too
        raise ValueError(f"SamplingParams.json_schema: {e}") from None


@functools.lru_cache(maxsize=256)
def _canonical_schema(text: str) -> str:
    """Checked once per text: a request's params are built again per choice and per stage
    (dataclasses.replace runs the checks anew)."""
    schema = json.loads(text)
    compile_schema(schema)
    return json.dumps(schema, sort_keys=True)
