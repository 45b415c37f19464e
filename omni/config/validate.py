"""The machinery behind omni/config/schema.py: typed field checks, dict -> dataclass building
with the full key path in every error, the stage graph, checkpoint-vs-adapter and resource checks
(raw loading is in omni/config/raw.py). Torch-free: `omni validate` runs it without any model code.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import functools
import math
import re
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

STAGE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")  # no dots: names are override path parts
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_EPS = 1e-6  # fractional resource requests (0.1 * 3) must not fail on rounding


class ConfigError(ValueError):
    """A bad stage config; the message names the stage, the full key path and the bad value."""


class FieldError(ValueError):
    """A bad value in one dataclass field; the loader re-raises it with the full key path."""

    def __init__(self, owner: str, field: str, message: str) -> None:
        super().__init__(f"{owner}.{field}: {message}")
        self.field = field
        self.message = message


def config_error(path: str, message: str) -> ConfigError:
    parts = path.split(".")
    prefix = f"stage {parts[1]!r}: " if len(parts) > 1 and parts[0] == "stages" else ""
    return ConfigError(f"{prefix}{path}: {message}")


_OWN = object()  # require's default: show the owner's attribute


def require(ok: bool, owner: object, field: str, expected: str, value: object = _OWN) -> None:
    """FieldError unless ok; the value shown defaults to the owner's attribute `field` (a
    dotted field, e.g. stream.enabled, is read through its parts)."""
    if not ok:
        if value is _OWN:
            value = owner
            for part in field.split("."):
                value = getattr(value, part)
        raise FieldError(type(owner).__name__, field, f"must be {expected}, got {value!r}")


def one_of(options: Iterable[str]) -> str:
    return "one of " + ", ".join(repr(o) for o in options)


def suggest(key: str, known: Iterable[str]) -> str:
    known = [str(k) for k in known]
    close = difflib.get_close_matches(key, known, n=1)
    return f" (did you mean {close[0]!r}?)" if close else f"; known: {', '.join(known) or 'none'}"


# ---- field types ------------------------------------------------------------------------------


class _Mismatch(Exception):
    pass


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _coerce(value: Any, hint: Any) -> Any:
    """`value` in the canonical form of `hint` (int -> float, list -> tuple), or _Mismatch."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        for arg in args:
            with contextlib.suppress(_Mismatch):
                return _coerce(value, arg)
    elif origin is tuple and isinstance(value, Mapping) and _is_pair(args[0]):
        # (key, value) pairs written as a mapping; integer keys may come as strings (JSON).
        digits = typing.get_args(args[0])[0] is int
        pairs = [(int(k) if digits and str(k).isdigit() else k, v) for k, v in value.items()]
        return _coerce(pairs, hint)
    elif origin is tuple and isinstance(value, list | tuple):
        if args[-1] is Ellipsis:
            return tuple(_coerce(v, args[0]) for v in value)
        if len(value) == len(args):  # a fixed-size tuple, e.g. a (token id, bias) pair
            return tuple(_coerce(v, a) for v, a in zip(value, args, strict=True))
    elif origin is dict and isinstance(value, Mapping):
        return {_coerce(k, args[0]): _coerce(v, args[1]) for k, v in value.items()}
    elif origin is None and not (isinstance(value, bool) and hint is not bool):
        # bool is an int subclass, but `num_blocks: true` is a mistake, never a count.
        if hint is float and isinstance(value, int | float) and math.isfinite(value):
            return float(value)
        if hint is not float and isinstance(value, hint):
            return value
    raise _Mismatch


def _describe(hint: Any) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in args)
    if origin is tuple and _is_pair(args[0]):
        key, value = typing.get_args(args[0])
        return f"a mapping from {_plural(key)} to {_plural(value)}"
    if origin is tuple:
        return f"a list of {_plural(args[0])}"
    if origin is dict:
        return f"a mapping from {_plural(args[0])} to {_plural(args[1])}"
    names = {bool: "a boolean", int: "an integer", float: "a finite number", str: "a string"}
    return "null" if hint is type(None) else names.get(hint, f"a mapping of {hint.__name__} keys")


def _is_pair(hint: Any) -> bool:
    args = typing.get_args(hint)
    return typing.get_origin(hint) is tuple and len(args) == 2 and args[-1] is not Ellipsis


def _plural(hint: Any) -> str:
    return _describe(hint).split(" ", 1)[1] + "s"


def coerce_fields(cls: type, values: Mapping[str, Any]) -> dict[str, Any]:
    """`values` type-checked against `cls`'s annotations; FieldError on the first mismatch."""
    out = dict(values)
    for name, value in values.items():
        try:
            out[name] = _coerce(value, _hints(cls)[name])
        except _Mismatch:
            expected, got = _describe(_hints(cls)[name]), f"{value!r} ({type(value).__name__})"
            raise FieldError(cls.__name__, name, f"must be {expected}, got {got}") from None
    return out


def check_types(obj: Any) -> None:
    """For a frozen dataclass's __post_init__: validate and canonicalise every field in place."""
    current = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    for name, value in coerce_fields(type(obj), current).items():
        object.__setattr__(obj, name, value)


def build(cls: type, data: Any, path: str) -> Any:
    """`cls` from a mapping; every error names `path` plus the offending key."""
    data = {} if data is None else data  # an empty YAML section (`engine:`) means all defaults
    if not isinstance(data, Mapping):
        raise config_error(path, f"must be a mapping, got {data!r}")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    for key in data:
        if key not in fields:
            raise config_error(path, f"unknown key {key!r}{suggest(str(key), fields)}")
    kwargs = {}
    for name, f in fields.items():
        if name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise config_error(f"{path}.{name}", "required key is missing")
            continue
        value, hint = data[name], _hints(cls)[name]
        if (
            isinstance(hint, type)
            and dataclasses.is_dataclass(hint)
            and (value is None or isinstance(value, Mapping))
        ):
            value = build(hint, value, f"{path}.{name}")
        kwargs[name] = value
    try:
        # Typed here too for classes that do not type-check themselves (SamplingParams).
        return cls(**coerce_fields(cls, kwargs))
    except FieldError as e:
        raise config_error(f"{path}.{e.field}", e.message) from None
    except ValueError as e:
        # SamplingParams' own messages read "SamplingParams.top_p must be ..., got 2".
        match = re.match(rf"{cls.__name__}\.(\w+) (.*)$", str(e), re.S)
        if match:
            raise config_error(f"{path}.{match[1]}", match[2]) from None
        raise config_error(path, str(e)) from None


def stage_path(index: int, data: Any) -> str:
    name = data.get("name") if isinstance(data, Mapping) else None
    ok = isinstance(name, str) and STAGE_NAME.match(name)
    return f"stages.{name}" if ok else f"stages[{index}]"


# ---- the stage graph and resources ------------------------------------------------------------


def stage_order(inputs: Mapping[str, Sequence[str]]) -> list[str]:
    """Stage names, each after all its inputs (ties keep config order); checks the graph.

    Rejects dangling inputs, cycles (named) and more than one final stage.
    """
    for name, upstreams in inputs.items():
        for upstream in upstreams:
            if upstream not in inputs:
                hint = suggest(upstream, inputs)
                raise config_error(f"stages.{name}.inputs", f"unknown stage {upstream!r}{hint}")
    order: list[str] = []
    pending = list(inputs)
    while ready := [n for n in pending if all(i in order for i in inputs[n])][:1]:
        order.append(ready[0])
        pending.remove(ready[0])
    if pending:  # each stage left waits on another one left: walk upstream until one repeats
        walk = [pending[0]]
        while walk.count(walk[-1]) < 2:
            walk.append(next(i for i in inputs[walk[-1]] if i in pending))
        cycle = walk[walk.index(walk[-1]) :][::-1]  # printed in data-flow direction
        raise config_error(f"stages.{cycle[0]}.inputs", f"cycle {' -> '.join(cycle)}")
    # One sink gives OmniOutput.final a single meaning; with several the pipeline would have to
    # guess which result the user wants, so such configs are rejected instead.
    sinks = [n for n in inputs if not any(n in ups for ups in inputs.values())]
    if len(sinks) > 1:
        names = ", ".join(repr(n) for n in sinks)
        raise config_error("stages", f"several final stages (no stage consumes them): {names}")
    return order


def check_resources(config: Any, nodes: list[dict[str, float]]) -> None:
    """ValueError unless every stage fits on some node and all stages fit at once.

    nodes: each node's total resources as Ray reports them ({"CPU": 2.0, "node_a": 1.0, ...}).
    The total matters because every stage actor must be alive at the same time: Ray would leave
    the last actors pending forever rather than fail.
    """
    field = {"CPU": "num_cpus", "GPU": "num_gpus"}
    totals: dict[str, float] = {}
    for stage in config.stages:
        demand = stage.resources.as_ray_resources()  # per replica: each is an actor
        for key, amount in demand.items():
            totals[key] = totals.get(key, 0.0) + amount * stage.resources.replicas
        if any(all(n.get(k, 0.0) + _EPS >= v for k, v in demand.items()) for n in nodes):
            continue
        for key, amount in demand.items():
            best = max((n.get(key, 0.0) for n in nodes), default=0.0)
            if best + _EPS < amount:
                where = f"stages.{stage.name}.resources.{field.get(key, 'custom.' + key)}"
                msg = f"requests {key}={amount:g} but the largest node has {key}={best:g}"
                raise config_error(where, msg)
        wanted = ", ".join(f"{k}={v:g}" for k, v in demand.items())
        raise config_error(f"stages.{stage.name}.resources", f"no single node has all of {wanted}")
    for key, amount in totals.items():
        have = sum(n.get(key, 0.0) for n in nodes)
        if have + _EPS < amount:
            raise ConfigError(
                f"the stages request {key}={amount:g} in total but the cluster has {key}={have:g};"
                f" lower resources.{field.get(key, 'custom.' + key)} (fractions like 0.5 are fine)"
            )
