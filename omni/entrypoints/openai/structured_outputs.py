"""vLLM's structured outputs on chat and completions: `structured_outputs` (`choice`: the reply
is one of these texts; `json`: a JSON schema; `json_object`: any JSON object) and its older
spellings `guided_choice` / `guided_json`, as SamplingParams.json_schema (a choice is
omni/core/json_schema.py's CHOICE). One source of a constraint per request: chat's
`response_format` or a forced tool call beside any of them is a 400, and so are vLLM's
`regex`, `grammar` and `structural_tag`, which are not served.
"""

from __future__ import annotations

import json
from typing import Any

from omni.core.json_schema import CHOICE, compile_schema
from omni.entrypoints.openai.errors import bad_request

SERVED = ("choice", "json", "json_object")
NOT_SERVED = ("regex", "grammar", "structural_tag")
# vLLM's options of how JSON is written: omni's grammar already allows whitespace between a
# value's tokens and takes only the schema's keys, so these are accepted and change nothing.
OPTIONS = ("disable_any_whitespace", "disable_additional_properties", "disable_fallback",
           "whitespace_pattern", "backend")  # fmt: skip


def requested(body: Any) -> str | None:
    """The request's vLLM constraint as SamplingParams.json_schema (None: none asked for);
    a 400 naming the field of a malformed or unserved one."""
    spec = getattr(body, "structured_outputs", None)
    field = "structured_outputs"
    legacy = {
        k: v for k in ("choice", "json") if (v := getattr(body, f"guided_{k}", None)) is not None
    }
    if legacy:
        if spec is not None or len(legacy) > 1:
            raise bad_request(
                "structured_outputs: give one constraint (structured_outputs, guided_choice or "
                "guided_json)",
                "structured_outputs",
            )
        key = next(iter(legacy))
        spec, field = {key: legacy[key]}, f"guided_{key}"
    if spec is None:
        return None
    for key in spec:
        if key in NOT_SERVED:
            raise bad_request(
                f"structured_outputs.{key}: not served; omni constrains replies to a choice, a "
                "JSON schema or a JSON object",
                f"structured_outputs.{key}",
                "unsupported_value",
            )
        if key not in SERVED and key not in OPTIONS:
            raise bad_request(
                f"structured_outputs.{key}: unknown; known: {[*SERVED, *NOT_SERVED, *OPTIONS]}",
                f"structured_outputs.{key}",
            )
    given = [key for key in SERVED if spec.get(key) not in (None, False)]
    if len(given) != 1:
        raise bad_request(
            f"structured_outputs: give exactly one of {list(SERVED)}, got {given}",
            "structured_outputs",
        )
    key = given[0]
    where = field if field != "structured_outputs" else f"structured_outputs.{key}"
    value = spec[key]
    if key == "json_object":
        if value is not True:
            raise bad_request(f"{where}: true or absent, got {value!r}", where)
        schema: Any = {"type": "object"}
    elif key == "choice":
        schema = {CHOICE: value}
    else:
        schema = _json(value, where)
    try:
        compile_schema(schema, where if key == "json" else "schema")
    except ValueError as e:
        message = str(e).replace(f"schema.{CHOICE}", where)
        raise bad_request(message, message.split(":")[0], "unsupported_value") from None
    return json.dumps(schema, sort_keys=True)


def _json(value: Any, where: str) -> Any:
    """A `json` constraint's schema: an object, or the JSON text of one."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as e:
            raise bad_request(f"{where}: not JSON ({e})", where) from None
    if not isinstance(value, dict):
        raise bad_request(f"{where}: a JSON schema object, got {value!r}", where)
    return value
