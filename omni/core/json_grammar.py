"""JSON that follows a schema, recognized one byte at a time: the grammar behind structured output
(SamplingParams.json_schema; OpenAI's `response_format`).

`initial(node)` is the state before any byte (the node from omni/core/json_schema.py's
`compile_schema`, which also says what subset of JSON Schema is served), `step(state, byte)` the
state after one more byte (None: no JSON of the schema starts with the bytes so far),
`is_complete(state)` whether the bytes so far are a whole value. A state is an immutable tuple of
frames (innermost last), so states are shared, hashed and cached freely
(omni/core/json_constraint.py caches a token mask per state). Whitespace is free between a
value's tokens, as JSON allows, but the reply starts with its value and ends with it: a model
that would rather go on than stop (small ones do) would pad it with whitespace up to
max_tokens. Strings
take any characters (raw UTF-8 or escapes), numbers JSON's syntax (integers without fraction or
exponent).
"""

from __future__ import annotations

import json
from typing import Any

from omni.core.json_schema import ANY, Node, encode

WHITESPACE = frozenset(b" \t\n\r")
DIGITS = frozenset(b"0123456789")
HEX = frozenset(b"0123456789abcdefABCDEF")
ESCAPES = frozenset(b'"\\/bfnrt')
_NUMBER_END = frozenset({2, 3, 5, 8})  # number phases that end a whole number


# ---- states ---------------------------------------------------------------------------------------
# Frames: ("V", node) a value of node may start (whitespace first); ("S", esc, count, low,
# high) inside a string (esc 0, 1 after a backslash, 2-5: that many - 1 hex digits of \uXXXX
# to come; count: its characters so far, up to its length bounds' largest: minLength low,
# maxLength high or None; an escape is one character, a \u surrogate pair two); ("N", phase,
# integer) a number; ("L", literals, pos) pos bytes into one of the JSON-encoded literals;
# ("O", node, phase, seen, value) an object: phase 0 after "{", 1 after ",", 2 in a key, 3
# before ":", 4 in a value, 5 after a value; seen: its keys so far; value: the node of the key
# being read; ("A", node, phase, count) an array: 0 after "[", 1 in a value, 2 after a value,
# 3 after ","; count: its items so far, up to its bounds' largest (0 without bounds);
# ("T", node, phase) a tool call (Node.tags): 0 in its opening, 1 in its arguments, 2 after
# them; ("D",) a whole value read (nothing may follow: only a stop token).
State = tuple[tuple[Any, ...], ...]


def initial(node: Node) -> State:
    return (("V", node),)


def is_complete(state: State) -> bool:
    top = state[-1]
    if len(state) != 1:
        return False
    kind = top[0]
    return (
        kind == "D"
        or (kind == "N" and top[1] in _NUMBER_END)
        or (kind == "I" and top[5] and _within(top[3] * top[4], top[1], top[2]))
        or (kind == "L" and any(len(lit) == top[2] for lit in top[1]))
    )


def step(state: State, byte: int) -> State | None:
    """The state after `byte`, or None where the schema's JSON cannot go on with it."""
    rest, top = state[:-1], state[-1]
    kind = top[0]
    if kind == "S":
        return _string(rest, top, byte)
    if kind == "V":
        return _value(rest, top[1], byte)
    if kind == "N":
        return _number(rest, top, byte)
    if kind == "I":
        return _bounded(rest, top, byte)
    if kind == "L":
        return _literal(rest, top, byte)
    if kind == "O":
        return _object(rest, top, byte)
    if kind == "A":
        return _array(rest, top, byte)
    if kind == "T":  # after a tool call's arguments: whitespace, then its closing brace
        return rest + (top,) if byte in WHITESPACE else _done(rest) if byte == ord("}") else None
    return None  # "D": a whole value ends the reply (trailing whitespace could run forever)


def _done(rest: State, key: bytes | None = None) -> State:
    """A value (or an object's key: `key`, its literal, None for a free key) ended."""
    if not rest:
        return (("D",),)
    top = rest[-1]
    if top[0] == "A":  # one more item (counted as far as the array's bounds need)
        node = top[1]
        cap = node.min_items if node.max_items is None else node.max_items
        return rest[:-1] + (("A", node, 2, min(top[3] + 1, cap)),)
    if top[0] == "T":  # its opening (key) picked the arguments' node; or they ended
        node = top[1]
        if top[2] == 1:
            return rest[:-1] + (("T", node, 2),)
        return rest[:-1] + (("T", node, 1), ("V", node.tags[key]))
    node, phase, seen, value = top[1:]
    if phase == 2:  # a key: the node of its value
        if node.properties is None:
            return rest[:-1] + (("O", node, 3, seen, node.values or ANY),)
        name = json.loads(key) if key is not None else ""
        return rest[:-1] + (("O", node, 3, seen | {name}, node.properties[name]),)
    return rest[:-1] + (("O", node, 5, seen, None),)


def _value(rest: State, node: Node, byte: int) -> State | None:
    if byte in WHITESPACE:  # not before the reply's value: it starts with it
        return rest + (("V", node),) if rest else None
    if node.choices is not None:  # anyOf: the alternative this byte starts
        chosen = node.choices.get(byte)
        return None if chosen is None else _value(rest, chosen, byte)
    if node.literals:
        return _literal(rest, ("L", node.literals, 0), byte)
    if node.tags:  # a tool call: its opening (name included) picks its arguments' node
        return _literal(rest + (("T", node, 0),), ("L", tuple(node.tags), 0), byte)
    kinds = node.kinds
    if byte == ord("{") and "object" in kinds:
        return rest + (("O", node, 0, frozenset(), None),)
    if byte == ord("[") and "array" in kinds:
        return rest + (("A", node, 0, 0),)
    if byte == ord('"') and "string" in kinds:
        return rest + (("S", 0, 0, node.min_length, node.max_length),)
    integer = "number" not in kinds
    if (byte == ord("-") or byte in DIGITS) and (not integer or "integer" in kinds):
        if node.minimum is not None or node.maximum is not None:
            return _bounded(rest, ("I", node.minimum, node.maximum, 1, 0, False), byte)
        return _number(rest, ("N", 0, integer), byte)
    literals = (b"true", b"false") * ("boolean" in kinds) + (b"null",) * ("null" in kinds)
    return _literal(rest, ("L", literals, 0), byte) if literals else None


def _string(rest: State, top: tuple[Any, ...], byte: int) -> State | None:
    esc, count, low, high = top[1:]
    full = high is not None and count >= high  # no more characters (maxLength)

    def after(new_esc: int, chars: int) -> State:
        cap = low if high is None else high  # counted as far as the bounds need
        return rest + (("S", new_esc, min(count + chars, cap), low, high),)

    if esc == 0:
        if byte == ord('"'):
            return _done(rest) if count >= low else None
        if byte < 0x20 or (full and not 0x80 <= byte < 0xC0):
            return None  # a control byte; or a new character (a UTF-8 lead byte, ASCII, "\\")
        if byte == ord("\\"):
            return after(1, 0)
        return after(0, 0 if 0x80 <= byte < 0xC0 else 1)  # a UTF-8 continuation adds none
    if esc == 1:
        if byte == ord("u"):
            return after(5, 0)
        return after(0, 1) if byte in ESCAPES else None
    if byte not in HEX:
        return None
    return after(esc - 1, 0) if esc > 2 else after(0, 1)


def _number(rest: State, top: tuple[Any, ...], byte: int) -> State | None:
    phase, integer = top[1], top[2]
    digit = byte in DIGITS
    if phase == 0:  # nothing yet
        new = 1 if byte == ord("-") else 2 if byte == ord("0") else 3 if digit else -1
    elif phase == 1:  # after "-"
        new = 2 if byte == ord("0") else 3 if digit else -1
    elif phase in (4, 7):  # after "." / an exponent's sign: a digit must come
        new = (5 if phase == 4 else 8) if digit else -1
    elif phase == 6:  # after "e"
        new = 7 if byte in b"+-" else 8 if digit else -1
    elif digit and phase in (3, 5, 8):
        new = phase
    elif byte == ord(".") and phase in (2, 3) and not integer:
        new = 4
    elif byte in b"eE" and phase in (2, 3, 5) and not integer:
        new = 6
    else:  # the number ended before this byte
        return step(_done(rest), byte) if phase in _NUMBER_END else None
    return None if new < 0 else rest + (("N", new, integer),)


def _bounded(rest: State, top: tuple[Any, ...], byte: int) -> State | None:
    """An integer within [low, high] (either None: unbounded): its sign and digits so far."""
    low, high, sign, digits, started = top[1:]
    if byte == ord("-") and not started and sign == 1:
        return rest + (("I", low, high, -1, 0, False),) if _reachable(-1, 0, low, high) else None
    if byte in DIGITS and not (started and digits == 0):  # no digit after a leading zero
        value = digits * 10 + byte - ord("0")
        if _reachable(sign, value, low, high, exact=True):
            return rest + (("I", low, high, sign, value, True),)
        return None
    if started and _within(sign * digits, low, high):  # it ended before this byte
        return step(_done(rest), byte)
    return None


def _within(value: int, low: int | None, high: int | None) -> bool:
    return (low is None or value >= low) and (high is None or value <= high)


def _reachable(
    sign: int, digits: int, low: int | None, high: int | None, exact: bool = False
) -> bool:
    """Whether an integer of this sign starting with these digits (itself, if `exact`, or with
    more digits after them) is within the bounds."""
    if exact and _within(sign * digits, low, high):
        return True
    if digits == 0 and exact:
        return False  # "0" or "-0": no digit may follow
    width = 1
    for _ in range(400):  # each more digit: [digits * 10^k, (digits + 1) * 10^k - 1]
        first, last = digits * 10 * width if digits else 1, (digits * 10 + 10) * width - 1
        width *= 10
        lo_value, hi_value = (first, last) if sign > 0 else (-last, -first)
        if (high is None or lo_value <= high) and (low is None or hi_value >= low):
            return True
        if sign > 0 and high is not None and first > high:
            return False
        if sign < 0 and low is not None and -first < low:
            return False
    return False


def _literal(rest: State, top: tuple[Any, ...], byte: int) -> State | None:
    literals, pos = top[1], top[2]
    going = tuple(lit for lit in literals if len(lit) > pos and lit[pos] == byte)
    if going:
        return rest + (("L", going, pos + 1),)
    ended = next((lit for lit in literals if len(lit) == pos), None)
    if ended is None:
        return None
    is_key = bool(rest) and (rest[-1][0] == "O" and rest[-1][2] == 2 or rest[-1][:3:2] == ("T", 0))
    return step(_done(rest, ended if is_key else None), byte)


def _object(rest: State, top: tuple[Any, ...], byte: int) -> State | None:
    node, phase, seen, value = top[1:]
    if byte in WHITESPACE:
        return rest + (top,) if phase != 2 and phase != 4 else None
    if phase in (0, 1) and byte == ord('"'):
        here = rest + (("O", node, 2, seen, None),)
        if node.properties is None:
            return here + (("S", 0, 0, 0, None),)
        keys = tuple(encode(k) for k in node.properties if k not in seen)
        return here + (("L", keys, 1),) if keys else None
    if phase == 0 and byte == ord("}") or phase == 5 and byte == ord("}"):
        return _done(rest) if node.required <= seen else None
    if phase == 3 and byte == ord(":"):
        return rest + (("O", node, 4, seen, None), ("V", value))
    if phase == 5 and byte == ord(","):
        more = node.properties is None or len(seen) < len(node.properties)
        return rest + (("O", node, 1, seen, None),) if more else None
    return None


def _array(rest: State, top: tuple[Any, ...], byte: int) -> State | None:
    node, phase, count = top[1], top[2], top[3]
    if byte in WHITESPACE:
        return rest + (top,)
    if byte == ord("]") and phase in (0, 2):
        return _done(rest) if count >= node.min_items else None
    if node.max_items is not None and count >= node.max_items:
        return None  # full: only "]" may come
    if phase == 2:
        return rest + (("A", node, 3, count),) if byte == ord(",") else None
    return _value(rest + (("A", node, 1, count),), node.items or ANY, byte)
