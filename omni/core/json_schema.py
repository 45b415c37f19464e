"""compile_schema: a JSON schema as the `Node`s that omni/core/json_grammar.py walks.

The subset (anything else is a ValueError naming its JSON path): `type` (object, array, string,
number, integer, boolean, null, or a list of them), `properties`, `required`, `items` (with
`minItems` / `maxItems`), `minLength` / `maxLength` (characters; an escaped surrogate pair counts
two), `minimum` / `maximum` and their exclusive forms (for integers), `enum`,
`const`, `anyOf` / `oneOf` whose alternatives start differently (a string or null, an object
or an array: what Pydantic writes for `Optional[...]` and unions of distinct types; then at most
one matches), `allOf` of one schema, `$ref` to `#/$defs/...` or `#/definitions/...` (recursive
ones too), `additionalProperties`: false, or a schema for an object without properties (a map:
any keys, those values), and the annotations `title`, `description`, `$schema`, `default`,
`examples`. So the schemas the openai client writes for Pydantic models
(`client.chat.completions.parse`) are served. An object with `properties` takes those keys only (OpenAI's strict mode), each at most
once, in any order, and ends only once every `required` one is in; an object without them takes
any keys with any values. `{}` (or no `type`) is any value.

Two omni keywords: TOOL_CALL (a function call, below) and CHOICE, `{"x-omni-choice": [text,
...]}` as a whole schema: the reply is exactly one of those texts, written as they are (not
JSON: vLLM's `choice` structured output).
"""

from __future__ import annotations

import json
import math
from typing import Any

TYPES = ("object", "array", "string", "number", "integer", "boolean", "null")
_ANNOTATIONS = frozenset(
    {"title", "description", "$schema", "default", "examples", "additionalProperties", "$defs",
     "definitions"}
)  # fmt: skip
_KEYWORDS = ("type", "properties", "required", "items", "minItems", "maxItems", "minLength",
             "maxLength", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "enum",
             "const", "anyOf", "oneOf", "allOf", "$ref")  # fmt: skip
_EXTENSIONS = frozenset({"x-omni-tool-call"})
_STARTS = {"object": b"{", "array": b"[", "string": b'"', "number": b"-0123456789",
           "integer": b"-0123456789", "boolean": b"tf", "null": b"n"}  # fmt: skip


class Node:
    """One schema position. Compared and hashed by identity: a compiled schema's nodes are shared
    by every state built from it."""

    __slots__ = (
        "kinds", "properties", "required", "items", "literals", "choices", "tags", "min_items",
        "max_items", "min_length", "max_length", "minimum", "maximum", "values",
    )  # fmt: skip

    def __init__(
        self,
        kinds: frozenset[str] = frozenset(),
        properties: dict[str, Node] | None = None,
        required: frozenset[str] = frozenset(),
        items: Node | None = None,
        literals: tuple[bytes, ...] = (),
        choices: dict[int, Node] | None = None,
        tags: dict[bytes, Node] | None = None,
        min_items: int = 0,
        max_items: int | None = None,
    ) -> None:
        self.kinds = kinds  # the JSON types a value may have here
        self.properties = properties  # an object's keys and their values; None: any keys
        self.required = required
        self.items = items  # an array's values (None: any)
        self.literals = literals  # enum/const: the only values, JSON-encoded
        self.choices = choices  # anyOf: the alternative each first byte of a value starts
        self.tags = tags  # TOOL_CALL: a call's opening text (up to its arguments) -> arguments
        self.min_items = min_items  # an array's bounds (minItems, maxItems)
        self.max_items = max_items
        self.min_length = 0  # a string's bounds in characters (minLength, maxLength)
        self.max_length: int | None = None
        self.minimum: int | None = None  # an integer's bounds, inclusive
        self.maximum: int | None = None
        self.values: Node | None = None  # an object without properties: its values (None: any)


ANY = Node(frozenset(TYPES))
TOOL_CALL = "x-omni-tool-call"
"""omni's keyword for one function call, `{"x-omni-tool-call": {name: parameters schema}}`: the
object `{"name": "<name>", "arguments": <JSON of its parameters>}`, spelled as Qwen's Hermes
calls are, the name and the arguments' schema chosen by the text so far (chat's tool_choice
"required", omni/entrypoints/openai/tools.py)."""


CHOICE = "x-omni-choice"
"""omni's keyword for a reply that is one of some texts, `{"x-omni-choice": ["yes", "no"]}`,
written as they are; only as a whole schema."""


def compile_schema(schema: Any, path: str = "schema") -> Node:
    """The schema's root node; a ValueError naming the path of what it cannot serve."""
    if isinstance(schema, dict) and CHOICE in schema:
        return _choice(schema, path)
    compiler = _Compiler(schema)
    root = compiler.node(schema, path)
    for node, alternatives, where in compiler.unions:  # refs are all resolved by now
        node.choices = {}
        for index, alternative in enumerate(alternatives):
            for byte in first_bytes(alternative):
                if byte in node.choices:
                    raise ValueError(
                        f"{where}.{index}: starts like an earlier alternative (with "
                        f"{chr(byte)!r}); only alternatives of distinct types are supported"
                    )
                node.choices[byte] = alternative
    return root


def _choice(schema: dict[str, Any], path: str) -> Node:
    """A CHOICE schema's node: its texts as the only literals (a reply's value starts at its
    first byte, so none may start with whitespace)."""
    texts = schema[CHOICE]
    if len(schema) != 1:
        other = sorted(set(schema) - {CHOICE})[0]
        raise ValueError(f"{path}.{other}: not supported beside {CHOICE}")
    if not isinstance(texts, list) or not texts:
        raise ValueError(f"{path}.{CHOICE}: a non-empty list of strings, got {texts!r}")
    for index, text in enumerate(texts):
        if not isinstance(text, str) or not text or text[0].isspace():
            raise ValueError(
                f"{path}.{CHOICE}.{index}: a non-empty string that does not start with "
                f"whitespace, got {text!r}"
            )
    return Node(literals=tuple(dict.fromkeys(text.encode() for text in texts)))


def first_bytes(node: Node) -> set[int]:
    """The bytes a value of `node` may start with (whitespace aside)."""
    if node.choices is not None:
        return set(node.choices)
    if node.literals:
        return {literal[0] for literal in node.literals}
    if node.tags:
        return {ord("{")}
    return {byte for kind in node.kinds for byte in _STARTS[kind]}


def call_opening(name: str) -> bytes:
    """A TOOL_CALL's text up to its arguments."""
    return b'{"name": ' + encode(name) + b', "arguments": '


def call_parts(text: str) -> tuple[str, str] | None:
    """A TOOL_CALL reply's (name, arguments) once its name is whole (None before): the arguments
    as far as they can be known to be, without the call's closing brace and the whitespace at
    the end (a `}` at the end may be that brace, so it waits for more text); for a whole reply,
    `.rstrip()` of them is all of its arguments. Each is a prefix of the next, as text comes."""
    start = text.find('{"name": "')
    end = text.find('", "arguments": ', start)
    if start < 0 or end < 0:
        return None
    name = json.loads(text[start + 9 : end + 1])
    arguments = text[end + len('", "arguments": ') :].rstrip()
    return name, arguments[:-1].rstrip() if arguments.endswith("}") else arguments


def encode(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


class _Compiler:
    def __init__(self, root: Any) -> None:
        self.root = root
        self.refs: dict[str, Node] = {}
        self.unions: list[tuple[Node, list[Node], str]] = []  # their choices, made at the end

    def node(self, schema: Any, path: str) -> Node:
        if schema is True or schema == {}:
            return ANY
        if not isinstance(schema, dict):
            raise ValueError(f"{path}: a schema must be an object, got {schema!r}")
        unknown = sorted(set(schema) - _ANNOTATIONS - set(_KEYWORDS) - _EXTENSIONS)
        if unknown:
            raise ValueError(
                f"{path}.{unknown[0]}: not supported (supported: {', '.join(_KEYWORDS)})"
            )
        if "$ref" in schema:
            return self.ref(schema["$ref"], path)
        if TOOL_CALL in schema:
            calls = schema[TOOL_CALL]
            if not isinstance(calls, dict) or not calls:
                raise ValueError(f"{path}.{TOOL_CALL}: an object of name -> parameters schema")
            # Each tool's parameters are a schema of their own (their $refs into their $defs).
            tags = {call_opening(name): compile_schema(params, f"{path}.{TOOL_CALL}.{name}")
                    for name, params in calls.items()}  # fmt: skip
            return Node(tags=tags)
        if "allOf" in schema:
            parts = schema["allOf"]
            if not isinstance(parts, list) or len(parts) != 1:
                raise ValueError(f"{path}.allOf: only a list of one schema is supported")
            return self.node(parts[0], f"{path}.allOf.0")
        for word in ("anyOf", "oneOf"):  # alternatives that start differently: one matches
            if word not in schema:
                continue
            options = schema[word]
            if not isinstance(options, list) or not options:
                raise ValueError(f"{path}.{word}: a non-empty list, got {options!r}")
            union = Node()
            alternatives = [self.node(s, f"{path}.{word}.{i}") for i, s in enumerate(options)]
            self.unions.append((union, alternatives, f"{path}.{word}"))
            return union
        return self.value(schema, path)

    def ref(self, ref: Any, path: str) -> Node:
        known = self.refs.get(ref)
        if known is not None:
            return known
        section, _, name = str(ref).removeprefix("#/").partition("/")
        defs = self.root.get(section) if isinstance(self.root, dict) else None
        if (
            section not in ("$defs", "definitions")
            or not isinstance(defs, dict)
            or name not in defs
        ):
            raise ValueError(f"{path}.$ref: {ref!r} is not a schema under #/$defs or #/definitions")
        node = self.refs[ref] = Node()  # filled below: a recursive ref meets it unfilled
        target = self.node(defs[name], f"schema.{section}.{name}")
        for slot in Node.__slots__:
            setattr(node, slot, getattr(target, slot))
        if target.choices is None and any(u is target for u, _, _ in self.unions):
            self.unions.append((node, next(a for u, a, _ in self.unions if u is target), path))
        return node

    def value(self, schema: dict[str, Any], path: str) -> Node:
        extra = schema.get("additionalProperties")
        if extra not in (None, False) and "properties" in schema:
            raise ValueError(
                f"{path}.additionalProperties: {extra!r} is not supported beside properties "
                "(an object with properties takes those keys only)"
            )
        if "required" in schema and "properties" not in schema:
            raise ValueError(f"{path}.required: needs properties")
        if "enum" in schema or "const" in schema:
            values = schema["enum"] if "enum" in schema else [schema["const"]]
            if not isinstance(values, list) or not values:
                raise ValueError(f"{path}.enum: a non-empty list, got {values!r}")
            return Node(literals=tuple(dict.fromkeys(encode(v) for v in values)))
        kinds = schema.get("type", list(TYPES))
        kinds = [kinds] if isinstance(kinds, str) else kinds
        if not isinstance(kinds, list) or not kinds or any(k not in TYPES for k in kinds):
            raise ValueError(f"{path}.type: one of {list(TYPES)} or a list of them, got {kinds!r}")
        properties: dict[str, Node] | None = {} if extra is False else None
        required: frozenset[str] = frozenset()
        if "properties" in schema:
            props = schema["properties"]
            if not isinstance(props, dict):
                raise ValueError(f"{path}.properties: an object, got {props!r}")
            properties = {k: self.node(v, f"{path}.properties.{k}") for k, v in props.items()}
            required = frozenset(schema.get("required", ()))
            missing = sorted(required - set(properties))
            if missing:
                raise ValueError(f"{path}.required: {missing[0]!r} is not in properties")
        items = self.node(schema["items"], f"{path}.items") if "items" in schema else None
        node = Node(frozenset(kinds), properties, required, items)
        if isinstance(extra, dict) and extra:  # a map: any keys, values of this schema
            node.values = self.node(extra, f"{path}.additionalProperties")
        node.min_items, node.max_items = _bounds(schema, path, "minItems", "maxItems")
        node.min_length, node.max_length = _bounds(schema, path, "minLength", "maxLength")
        node.minimum, node.maximum = _integer_bounds(schema, path, kinds)
        return node


def _integer_bounds(schema: dict[str, Any], path: str, kinds: list[str]) -> tuple[Any, Any]:
    """minimum / maximum (exclusive ones made inclusive), for integers only: a number's digits
    after its point would need a grammar of their own."""
    keys = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
    given = [k for k in keys if k in schema]
    if not given:
        return None, None
    if "number" in kinds or "integer" not in kinds:
        raise ValueError(f"{path}.{given[0]}: served for type integer only")
    bounds: list[int | None] = [None, None]
    for key in given:
        value = schema[key]
        if type(value) not in (int, float) or value != value or abs(value) == float("inf"):
            raise ValueError(f"{path}.{key}: a number, got {value!r}")
        low = key in ("minimum", "exclusiveMinimum")
        exclusive = key.startswith("exclusive")
        bound = math.floor(value) + 1 if low and exclusive else math.ceil(value) if low else (
            math.ceil(value) - 1 if exclusive else math.floor(value))  # fmt: skip
        index = 0 if low else 1
        current = bounds[index]
        bounds[index] = (
            bound if current is None else max(current, bound) if low else min(current, bound)
        )
    if bounds[0] is not None and bounds[1] is not None and bounds[0] > bounds[1]:
        raise ValueError(f"{path}.{given[0]}: no integer is within the bounds")
    return bounds[0], bounds[1]


def _bounds(schema: dict[str, Any], path: str, low_key: str, high_key: str) -> tuple[int, Any]:
    low, high = schema.get(low_key, 0), schema.get(high_key)
    for name, bound in ((low_key, low), (high_key, high)):
        if bound is not None and (type(bound) is not int or bound < 0):
            raise ValueError(f"{path}.{name}: an integer >= 0, got {bound!r}")
    if high is not None and low > high:
        raise ValueError(f"{path}.{low_key}: {low} is more than {high_key} {high}")
    return low, high
