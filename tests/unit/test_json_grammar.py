"""omni/core/json_grammar.py: JSON of a schema, one byte at a time. Python's json module is the
oracle for plain JSON (random values, compact and indented, ASCII-escaped or raw UTF-8); schema
cases check what a schema admits and refuses; compile errors name the schema path."""

from __future__ import annotations

import json
import random

import pytest

from omni.core.json_grammar import initial, is_complete, step
from omni.core.json_schema import ANY, CHOICE, compile_schema
from omni.core.sampling_params import SamplingParams


def walk(node, text: str):
    """The state after the text's bytes, None once one is refused."""
    state = initial(node)
    for byte in text.encode():
        state = step(state, byte)
        if state is None:
            return None
    return state


def accepts(node, text: str) -> bool:
    state = walk(node, text)
    return state is not None and is_complete(state)


def prefix_ok(node, text: str) -> bool:
    return walk(node, text) is not None


def random_value(rng: random.Random, depth: int = 0):
    kind = rng.randrange(7 if depth < 3 else 4)
    if kind == 0:
        return rng.randrange(-1000, 1000)
    if kind == 1:
        return rng.random() * 10 ** rng.randrange(-6, 6) * rng.choice([1, -1])
    if kind == 2:
        return "".join(rng.choice('ab"\\\n\t\u00e9\u4e2d x/') for _ in range(rng.randrange(6)))
    if kind == 3:
        return rng.choice([True, False, None])
    if kind in (4, 5):
        return {
            f"k{rng.randrange(9)}": random_value(rng, depth + 1) for _ in range(rng.randrange(4))
        }
    return [random_value(rng, depth + 1) for _ in range(rng.randrange(4))]


def test_any_value_accepts_what_json_writes():
    rng = random.Random(0)
    for _ in range(400):
        value = random_value(rng)
        for indent in (None, 2):
            text = json.dumps(value, indent=indent, ensure_ascii=rng.random() < 0.5)
            assert accepts(ANY, text), text
            assert not prefix_ok(ANY, f" {text}")  # the reply starts with its value
            assert not prefix_ok(ANY, f"{text} ")  # nothing follows a whole value


@pytest.mark.parametrize(
    "text",
    ["{", '{"a"}', "[1,]", "01", "-", "1.", "1e", '"\x01"', '{"a":1,}', "tru", '"\\x"', "[1 2]",
     '{"a" 1}', "{,}", '"\\u12g4"', "nul", "[]]", '{"a":1}}', "1 2", "+1", ".5", "--1"],
)  # fmt: skip
def test_any_value_refuses_what_json_refuses(text):
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)
    assert not accepts(ANY, text)


PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "score": {"type": "number"},
        "tags": {"type": "array", "items": {"enum": ["a", "bc", 1]}},
        "pet": {"type": ["string", "null"]},
        "flag": {"type": "boolean"},
        "kind": {"const": "human"},
    },
    "required": ["name", "age"],
}


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ('{"name": "Bo", "age": 3}', True),
        ('{"age": -3, "name": "Bo"}', True),  # any order
        ('{"name":"Bo","age":3,"score":1.5e3,"tags":["a",1,"bc"],"pet":null,"flag":false,'
         '"kind":"human"}', True),
        ('{"name": "Bo", "age": 3, "pet": "cat"}', True),
        ('{"name": "Bo"}', False),  # age is required
        ('{"name": "Bo", "age": 3.5}', False),  # an integer
        ('{"name": "Bo", "age": 3e2}', False),
        ('{"name": "Bo", "age": 3, "other": 1}', False),  # only the declared keys
        ('{"name": "Bo", "name": "Al", "age": 3}', False),  # each key once
        ('{"name": "Bo", "age": 3, "tags": ["b"]}', False),  # enum
        ('{"name": "Bo", "age": 3, "kind": "robot"}', False),  # const
        ('{"name": "Bo", "age": 3, "pet": 5}', False),
        ('{"name": 5, "age": 3}', False),
        ('["Bo", 3]', False),
    ],
)  # fmt: skip
def test_a_schema_admits_its_objects_only(text, ok):
    assert accepts(compile_schema(PERSON), text) is ok


def test_prefixes_stay_alive_until_they_break():
    node = compile_schema(PERSON)
    assert prefix_ok(node, '{"na') and prefix_ok(node, '{"name": "B')
    assert not prefix_ok(node, '{"nb')  # no declared key starts so
    assert not prefix_ok(node, '{"name": "Bo"}')  # closed before its required age
    every = '{"name":"a","age":1,"score":1,"tags":[],"pet":null,"flag":true,"kind":"human"'
    assert prefix_ok(compile_schema(PERSON), every) and not prefix_ok(node, every + ",")


def test_enums_of_numbers_that_prefix_each_other():
    node = compile_schema({"enum": [1, 10, "x", None]})
    assert all(accepts(node, t) for t in ("1", "10", '"x"', "null"))
    assert not any(accepts(node, t) for t in ("100", "2", '"y"', "nul"))


def test_arrays_within_their_bounds():
    node = compile_schema(
        {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 2}
    )
    assert not accepts(node, "[]") and accepts(node, "[1]") and accepts(node, "[1, 2]")
    assert not prefix_ok(node, "[1, 2,") and not accepts(node, "[1, 2, 3]")
    empty = compile_schema({"type": "array", "maxItems": 0})
    assert accepts(empty, "[ ]") and not prefix_ok(empty, "[1")
    with pytest.raises(ValueError, match="schema.minItems: 3 is more than maxItems 2"):
        compile_schema({"type": "array", "minItems": 3, "maxItems": 2})
    with pytest.raises(ValueError, match="schema.maxItems: an integer >= 0"):
        compile_schema({"type": "array", "maxItems": -1})


def test_strings_within_their_length_in_characters():
    node = compile_schema({"type": "string", "minLength": 2, "maxLength": 3})
    for text, ok in [('"a"', False), ('"ab"', True), ('"\\u00e9\\n\\u4e2d"', True),
                     ('"é中x"', True), ('"é中xy"', False), ('"abcd"', False)]:  # fmt: skip
        assert accepts(node, text) is ok, text
    assert not prefix_ok(node, '"abcd') and prefix_ok(node, '"abc')


@pytest.mark.parametrize(
    ("bounds", "low", "high"),
    [({"minimum": 0}, 0, None), ({"minimum": -12, "maximum": 7}, -12, 7),
     ({"exclusiveMinimum": 9.5, "exclusiveMaximum": 1000}, 10, 999),
     ({"maximum": -20}, None, -20), ({"minimum": 100, "maximum": 100}, 100, 100)],
)  # fmt: skip
def test_integers_within_their_bounds(bounds, low, high):
    node = compile_schema({"type": "integer", **bounds})
    for value in range(-1500, 1500):
        inside = (low is None or value >= low) and (high is None or value <= high)
        assert accepts(node, str(value)) is inside, value
    assert not accepts(node, "01") and not accepts(node, "1.0") and not accepts(node, "--1")


def test_bounds_only_for_integers():
    with pytest.raises(ValueError, match="schema.minimum: served for type integer only"):
        compile_schema({"type": "number", "minimum": 0})
    with pytest.raises(ValueError, match="schema.minimum: no integer is within the bounds"):
        compile_schema({"type": "integer", "minimum": 3, "maximum": 2})


def test_objects_without_properties_take_any_keys_or_none():
    assert accepts(compile_schema({"type": "object"}), '{"x": [1, {"y": null}]}')
    closed = compile_schema({"type": "object", "additionalProperties": False})
    assert accepts(closed, "{}") and not prefix_ok(closed, '{"')


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        ({"not": {"type": "string"}}, "schema.not: not supported"),
        ({"oneOf": [{"type": "object"}, {"type": "object"}]}, "schema.oneOf.1: starts like"),
        ({"anyOf": [{"type": "string"}, {"enum": ["x"]}]}, "schema.anyOf.1: starts like"),
        ({"$ref": "#/$defs/Missing"}, "schema.$ref: '#/$defs/Missing' is not a schema"),
        ({"allOf": [{}, {}]}, "schema.allOf: only a list of one schema"),
        ({"type": "object", "properties": {"a": {"type": "date"}}}, "schema.properties.a.type:"),
        ({"type": "object", "properties": {"a": {}}, "required": ["b"]}, "schema.required: 'b'"),
        ({"type": "array", "items": {"pattern": "x"}}, "schema.items.pattern: not supported"),
        ({"properties": {"a": {}}, "additionalProperties": True}, "schema.additionalProperties:"),
        (
            {"type": "object", "additionalProperties": {"format": "x"}},
            "schema.additionalProperties.format: not supported",
        ),
        ({"enum": []}, "schema.enum: a non-empty list"),
        ("string", "schema: a schema must be an object"),
    ],
)
def test_unsupported_schemas_name_their_path(schema, message):
    with pytest.raises(ValueError) as info:
        compile_schema(schema)
    assert str(info.value).startswith(message), str(info.value)
    with pytest.raises(ValueError, match="^SamplingParams.json_schema: schema"):
        SamplingParams(json_schema=schema if isinstance(schema, dict) else json.dumps(schema))


def test_sampling_params_keep_a_canonical_schema_text():
    a = SamplingParams(json_schema={"type": "object", "required": [], "properties": {}})
    b = SamplingParams(json_schema='{"properties": {}, "required": [], "type": "object"}')
    assert a == b and hash(a) == hash(b) and isinstance(a.json_schema, str)
    with pytest.raises(ValueError, match="^SamplingParams.json_schema: Expecting"):
        SamplingParams(json_schema="{not json")


def test_pydantic_models_with_refs_unions_and_recursion():
    from typing import Literal

    from pydantic import BaseModel

    class Address(BaseModel):
        street: str
        zip: int | None

    class Person(BaseModel):
        name: str
        tags: list[str]
        home: Address
        kind: Literal["a", "b"]
        parent: Person | None = None  # recursive: a $ref to the schema being compiled

    node = compile_schema(Person.model_json_schema())
    grandparent = Person(name="G", tags=[], home=Address(street="s", zip=None), kind="a")
    person = Person(
        name="Ann \u00e9", tags=["x", "y"], home=Address(street="Main", zip=12), kind="b",
        parent=Person(name="P", tags=["z"], home=Address(street="o", zip=3), kind="a",
                      parent=grandparent),
    )  # fmt: skip
    for text in (person.model_dump_json(), person.model_dump_json(indent=2)):
        assert accepts(node, text), text
    assert not accepts(node, '{"name": "A", "tags": [], "kind": "a"}')  # home is required
    bad_zip = '{"name":"A","tags":[],"home":{"street":"s","zip":"1"},"kind":"a"}'
    assert not accepts(node, bad_zip)
    assert not accepts(node, bad_zip.replace('"kind":"a"', '"kind":"c"').replace('"1"', "1"))
    assert accepts(node, bad_zip.replace('"1"', "null"))


# ---- property: the grammar accepts exactly what a JSON Schema validator accepts -------------------
def _schemas():
    from hypothesis import strategies as st

    leaves = st.sampled_from(
        [{"type": t} for t in ("string", "integer", "number", "boolean", "null")]
        + [{}, {"enum": [1, "a", None]}, {"const": "x"}, {"type": ["string", "null"]}]
        + [{"type": "string", "minLength": 1, "maxLength": 3}, {"type": "string", "minLength": 2},
           {"type": "string", "maxLength": 0}, {"type": "integer", "minimum": -5, "maximum": 120},
           {"type": "integer", "exclusiveMinimum": 0}, {"type": "integer", "maximum": -3},
           {"type": ["integer", "null"], "minimum": 10, "exclusiveMaximum": 100.5}]
    )  # fmt: skip

    def nest(children):
        properties = st.dictionaries(st.sampled_from("abc"), children, max_size=3)
        return st.one_of(
            st.builds(lambda i: {"type": "array", "items": i}, children),
            st.builds(
                lambda i, low, more: {
                    "type": "array",
                    "items": i,
                    "minItems": low,
                    "maxItems": low + more,
                },
                children,
                st.integers(0, 2),
                st.integers(0, 1),
            ),  # fmt: skip
            properties.flatmap(
                lambda p: st.builds(
                    lambda r: {
                        "type": "object",
                        "properties": p,
                        "required": sorted(r),
                        "additionalProperties": False,
                    },  # fmt: skip
                    st.sets(st.sampled_from(sorted(p)) if p else st.nothing(), max_size=len(p)),
                )
            ),
            st.just({"type": "object"}),
            st.builds(lambda a: {"anyOf": [a, {"type": "null"}]}, children),
            st.builds(lambda a: {"oneOf": [{"type": "null"}, a]}, children),
            st.builds(lambda v: {"type": "object", "additionalProperties": v}, children),
        )

    return st.recursive(leaves, nest, max_leaves=6)


def _values():
    from hypothesis import strategies as st

    bmp = st.characters(max_codepoint=0xFFFF, exclude_categories=("Cs",))  # no surrogate pairs
    scalars = st.one_of(
        st.none(), st.booleans(), st.integers(-10**6, 10**6), st.sampled_from(["a", "x", ""]),
        st.integers(-200, 200),
        st.text(bmp, max_size=4),
        st.floats(allow_nan=False, allow_infinity=False).filter(lambda f: not f.is_integer()),
    )  # fmt: skip
    return st.recursive(
        scalars,
        lambda c: st.one_of(
            st.lists(c, max_size=3), st.dictionaries(st.sampled_from("abcd"), c, max_size=3)
        ),
        max_leaves=8,
    )


def test_the_grammar_agrees_with_a_json_schema_validator():
    import jsonschema
    from hypothesis import given, settings
    from hypothesis import strategies as st

    @settings(max_examples=400, deadline=None, derandomize=True)
    @given(_schemas(), _values(), st.booleans(), st.booleans())
    def check(schema, value, indent, ascii_only):

        try:
            node = compile_schema(schema)
        except ValueError:
            return  # an anyOf whose alternatives start alike (e.g. of an enum with null)
        text = json.dumps(value, indent=2 if indent else None, ensure_ascii=ascii_only)
        valid = jsonschema.Draft202012Validator(schema).is_valid(value)
        assert accepts(node, text) == valid, (schema, text)

    check()


def test_a_choice_is_one_of_its_texts_as_written():
    node = compile_schema({CHOICE: ["yes", "yes, gladly", 'say "hi"', "é"]})
    for text in ("yes", "yes, gladly", 'say "hi"', "é"):
        assert accepts(node, text), text
    assert prefix_ok(node, "yes,") and not accepts(node, "yes,")
    for text in ('"yes"', " yes", "yes ", "no", "yes, gladly!", ""):
        assert not accepts(node, text), text
    for schema, where in [
        ({CHOICE: []}, "schema.x-omni-choice"),
        ({CHOICE: "yes"}, "schema.x-omni-choice"),
        ({CHOICE: ["a", "\tb"]}, "schema.x-omni-choice.1"),
        ({CHOICE: ["a", 1]}, "schema.x-omni-choice.1"),
        ({CHOICE: ["a"], "type": "string"}, "schema.type"),
        ({"type": "object", "properties": {"a": {CHOICE: ["a"]}}}, "schema.properties.a.x-omni-choice"),
    ]:  # fmt: skip
        with pytest.raises(ValueError) as info:
            compile_schema(schema)
        assert str(info.value).startswith(where + ":"), (schema, str(info.value))
