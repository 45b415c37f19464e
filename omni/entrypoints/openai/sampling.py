"""Request fields -> one SamplingParams per stage.

Every stage starts from its config default (`stage.sampling`). `stage_sampling` (omni extension,
`{stage name: {SamplingParams field: value}}`) replaces fields of any stage. Then the OpenAI
fields (`max_tokens`/`max_completion_tokens`, `temperature`, `top_p`, `presence_penalty`,
`frequency_penalty`, `logit_bias`, `seed`, `stop`, `top_k` as vLLM takes it, and the number of
logprobs asked for: chat's `top_logprobs` with `logprobs`, completions' `logprobs`) apply to the last
text stage (the thinker of Qwen2.5-Omni). Fields left out keep the config's value (so
`temperature` defaults to the config's, which is greedy in the shipped configs, not OpenAI's 1),
except `max_tokens`: a chat, completions or realtime request without it generates until the end
of the context (EOS, a stop, or the stage's max_model_len), as OpenAI's and vLLM's do, unless
`omni serve --max-tokens N` sets a server default (`until_end`).

`max_tokens` must fit beside the prompt in the context of the stage it applies to (when that stage
takes the request's prompt, as the thinker does): a 400 naming it, the prompt length and the
limit otherwise, as OpenAI and vLLM answer (`check_context`). The Python API caps instead.

`stop` (up to 4 strings): where the request ends at the text stage (`text_final`: no audio),
they are matched on its text, as OpenAI matches them (SamplingParams.stop, omni/driver/
stop_strings.py). With audio the text stage is not the request's last, so each stop string must
be exactly one token of its tokenizer, and stops it by token id (a 400 naming `stop` otherwise).
Either way the stop string is not part of the returned text.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from omni.core.json_schema import compile_schema
from omni.core.sampling_params import SamplingParams
from omni.entrypoints.openai.errors import bad_request
from omni.messages import PromptInput
from omni.registry import produces_text

FIELDS = tuple(f.name for f in dataclasses.fields(SamplingParams))


@dataclasses.dataclass(frozen=True)
class Plan:
    params: dict[str, SamplingParams]
    stop_strings: dict[int, str]
    """Token id -> the text cut off the end of a reply that stopped on it: the user's stop
    string it stands for, or a `stop_token_ids` token's own text (vLLM leaves it out)."""


def plan(
    async_omni: Any,
    text_stage: str,
    *,
    max_tokens: int | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    presence_penalty: float | None = None,
    frequency_penalty: float | None = None,
    repetition_penalty: float | None = None,
    min_p: float | None = None,
    min_tokens: int | None = None,
    ignore_eos: bool | None = None,
    stop_token_ids: list[int] | None = None,
    include_stop_str_in_output: bool | None = None,
    logit_bias: dict[str, float] | None = None,
    seed: int | None = None,
    stop: str | list[str] | None = None,
    stage_sampling: dict[str, dict[str, Any]] | None = None,
    min_text_tokens: int | None = None,
    logprobs: int | None = None,
    prompt_logprobs: int | None = None,
    text_final: bool = False,
    json_schema: str | None = None,
    until_end: bool = False,
    default_max_tokens: int | None = None,
) -> Plan:
    """until_end: a request that sets no max_tokens (nor stage_sampling's for the text stage)
    gets default_max_tokens (the server's), where None generates until the end of the context
    as OpenAI's do, instead of the stage config's max_tokens."""
    params = {s.name: s.sampling for s in async_omni.config.stages}
    for name, fields in (stage_sampling or {}).items():
        if name not in params:
            raise bad_request(
                f"stage_sampling: no stage {name!r}; stages: {list(params)}",
                f"stage_sampling.{name}",
            )
        if (
            isinstance(fields, dict)
            and "json_schema" in fields
            and not produces_text(async_omni.config.stage(name).adapter)
        ):
            raise bad_request(
                f"stage_sampling.{name}.json_schema: stage {name!r} makes no text",
                f"stage_sampling.{name}.json_schema",
            )
        params[name] = _replace(params[name], fields, f"stage_sampling.{name}")

    strings = _stop_strings(stop)
    stop_strings = {} if text_final else _stop_tokens(async_omni, strings)
    text: dict[str, Any] = {
        k: v
        for k, v in (
            ("max_tokens", max_tokens),
            ("temperature", temperature),
            ("top_p", top_p),
            ("top_k", None if top_k is None else max(top_k, 0)),  # vLLM's -1: no top-k
            ("presence_penalty", presence_penalty),
            ("frequency_penalty", frequency_penalty),
            ("repetition_penalty", repetition_penalty),
            ("min_p", min_p),
            ("min_tokens", min_tokens),
            ("ignore_eos", ignore_eos),
            ("include_stop_str_in_output", include_stop_str_in_output),
            ("logit_bias", logit_bias),
            ("seed", seed),
            ("logprobs", logprobs),
            ("prompt_logprobs", prompt_logprobs),
            ("json_schema", json_schema),
        )
        if v is not None
    }
    if text_final and strings:
        text["stop"] = tuple(strings)
    if stop_strings or stop_token_ids:
        merged = dict.fromkeys(params[text_stage].stop_token_ids)
        merged |= dict.fromkeys(stop_token_ids or ()) | dict.fromkeys(stop_strings)
        text["stop_token_ids"] = tuple(merged)
    staged = (stage_sampling or {}).get(text_stage) or {}
    if until_end and max_tokens is None and "max_tokens" not in staged:
        text["max_tokens"] = default_max_tokens
    configured = params[text_stage].max_tokens  # None: until the end, room enough already
    if min_text_tokens is not None and max_tokens is None and configured is not None:
        text["max_tokens"] = max(configured, min_text_tokens)
    params[text_stage] = _replace(params[text_stage], text, None)
    if include_stop_str_in_output:  # the stop's text stays in the returned text
        stop_strings = {}
    elif stop_token_ids:  # as vLLM: the text of the stop token that ended a reply is left out
        tokenizer = async_omni.prompt_processor.tokenizer
        vocab = len(tokenizer) if tokenizer is not None else 0
        ids = [t for t in dict.fromkeys(stop_token_ids) if t < vocab and t not in stop_strings]
        pieces = async_omni.token_texts(text_stage, ids)
        stop_strings |= {t: piece for t, (piece, _) in zip(ids, pieces, strict=True) if piece}
    return Plan(params, stop_strings)


def choice_plans(
    async_omni: Any,
    text_stage: str,
    body: Any,
    n: int,
    *,
    max_tokens: int | None,
    logprobs: int | None,
    prompt_logprobs: int | None = None,
    text_final: bool,
    default_max_tokens: int | None,
    json_schema: str | None = None,
) -> list[Plan]:
    """One Plan per choice of a chat or completions request (its OpenAI sampling fields, from
    `body`); choice j of a request with a `seed` samples with seed + j, so that the choices
    differ and each equals the same request alone with that seed."""
    return [
        plan(
            async_omni,
            text_stage,
            max_tokens=max_tokens,
            temperature=body.temperature,
            top_p=body.top_p,
            top_k=body.top_k,
            presence_penalty=body.presence_penalty,
            frequency_penalty=body.frequency_penalty,
            repetition_penalty=body.repetition_penalty,
            min_p=body.min_p,
            min_tokens=body.min_tokens,
            ignore_eos=body.ignore_eos,
            stop_token_ids=body.stop_token_ids,
            include_stop_str_in_output=body.include_stop_str_in_output,
            logit_bias=body.logit_bias,
            seed=None if body.seed is None else body.seed + j,
            stop=body.stop,
            stage_sampling=body.stage_sampling,
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            text_final=text_final,
            json_schema=json_schema,
            until_end=True,
            default_max_tokens=default_max_tokens,
        )
        for j in range(n)
    ]


def json_schema_of(response_format: dict[str, Any] | None) -> str | None:
    """Chat's `response_format` as SamplingParams.json_schema: None for text, any object for
    json_object, the schema of json_schema (omni/core/json_schema.py's subset); a 400 naming
    the field otherwise."""
    if response_format is None or response_format.get("type") in (None, "text"):
        return None
    kind = response_format.get("type")
    if kind == "json_object":
        return '{"type": "object"}'
    if kind != "json_schema":
        raise bad_request(
            f"response_format.type: {kind!r} is not one of 'text', 'json_object', 'json_schema'",
            "response_format.type",
        )
    spec = response_format.get("json_schema")
    schema = spec.get("schema") if isinstance(spec, dict) else None
    if not isinstance(schema, dict):
        raise bad_request(
            f"response_format.json_schema.schema: a JSON schema object is required, got {schema!r}",
            "response_format.json_schema.schema",
        )
    path = "response_format.json_schema.schema"
    try:
        compile_schema(schema, path)
    except ValueError as e:
        raise bad_request(str(e), str(e).split(":")[0], "unsupported_value") from None
    return json.dumps(schema, sort_keys=True)


def check_context(
    async_omni: Any, text_stage: str, prompt: PromptInput, max_tokens: int | None, param: str
) -> None:
    """A 400 when the prompt and the requested max_tokens (the request's `param`, None when it
    sets none: the config's default is capped, not refused) overflow max_model_len of the text
    stage, if that stage takes the request's prompt (a root stage: the thinker)."""
    stage = async_omni.config.stage(text_stage)
    limit = stage.engine.max_model_len
    if max_tokens is None or stage.inputs or limit is None:
        return
    num_prompt = len(prompt.prompt_token_ids)
    if num_prompt + max_tokens > limit:
        raise bad_request(
            f"{param} is too large: {max_tokens}. This model's maximum context length is "
            f"{limit} tokens (max_model_len of stage {text_stage!r}) and the prompt has "
            f"{num_prompt} tokens ({num_prompt} + {max_tokens} > {limit}): at most "
            f"{max(limit - num_prompt, 0)} tokens can be generated.",
            param,
            "context_length_exceeded",
        )


def _replace(base: SamplingParams, fields: Any, where: str | None) -> SamplingParams:
    if not isinstance(fields, dict):
        raise bad_request(
            f"{where} must be an object of SamplingParams fields, got {fields!r}", where
        )
    unknown = sorted(set(fields) - set(FIELDS))
    if unknown:
        raise bad_request(
            f"{where}: unknown field(s) {unknown}; SamplingParams fields: {list(FIELDS)}",
            f"{where}.{unknown[0]}",
        )
    try:
        return dataclasses.replace(base, **fields)
    except (TypeError, ValueError) as e:
        # SamplingParams names the field: "SamplingParams.max_tokens must be ..., got -1"
        name = next((f for f in FIELDS if f"SamplingParams.{f} " in str(e)), None)
        param = name if where is None else (f"{where}.{name}" if name else where)
        raise bad_request(f"{param}: {e}" if param else str(e), param) from None


def _stop_strings(stop: str | list[str] | None) -> list[str]:
    strings = [] if stop is None else [stop] if isinstance(stop, str) else list(stop)
    if len(strings) > 4:
        raise bad_request(f"stop: at most 4 sequences, got {len(strings)}", "stop")
    if not all(strings):
        raise bad_request("stop: an empty stop sequence", "stop")
    return strings


def _stop_tokens(async_omni: Any, strings: list[str]) -> dict[int, str]:
    out: dict[int, str] = {}
    for s in strings:
        ids = async_omni.tokenize(s)
        if len(ids) != 1:
            raise bad_request(
                f"stop: {s!r} is {len(ids)} tokens; with audio, omni stops the text stage on "
                "single tokens, so each stop sequence must be exactly one token of the model's "
                "tokenizer (without audio, any stop string is served)",
                "stop",
                "unsupported_value",
            )
        out[ids[0]] = s
    return out
