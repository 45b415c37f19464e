"""OpenAI's `logprobs` from the text stage's TokenLogprobs (SamplingParams.logprobs: the model's
own log-probabilities, before temperature, penalties, bias and filters).

- chat (`logprobs: true`, `top_logprobs` 0-20): `choices[i].logprobs = {"content": [{token,
  logprob, bytes, top_logprobs: [{token, logprob, bytes}]}], "refusal": null}`;
- completions (`logprobs` 0-20; OpenAI's own bound is 5): `{"tokens", "token_logprobs",
  "top_logprobs": [{token: logprob}], "text_offset"}`; with `echo`, the prompt's tokens come
  first (SamplingParams.prompt_logprobs), the first with null logprobs, as OpenAI answers.

Tokens are shown as `TokenText` gives them (omni/entrypoints/token_text.py). The token that
stopped the request (EOS or a stop token, which the text leaves out) is not listed. Streamed,
each chunk carries the tokens that are new since the last one that carried any.
"""

from __future__ import annotations

from typing import Any

from omni.core.logprobs import TokenLogprobs
from omni.messages import OmniOutput

FLOOR = -9999.0
"""JSON has no -inf: a token of probability 0 gets this instead (as vLLM answers)."""


class LogprobCursor:
    """The logprobs of one request's text-stage tokens, in OpenAI's form, as they come."""

    def __init__(self, async_omni: Any, text_stage: str, chat: bool, text_offset: int = 0) -> None:
        """text_offset: completions: where the first generated token's text starts in the
        returned text (after an echoed prompt)."""
        self.async_omni, self.text_stage, self.chat = async_omni, text_stage, chat
        self.num_sent = 0
        self.text_offset = text_offset  # completions: characters of the listed tokens so far

    def echoed(self, out: OmniOutput, completion: dict[str, Any] | None) -> dict[str, Any] | None:
        """Completions with `echo`: the prompt tokens' logprobs (the text stage's
        prompt_logprobs; None for the first token) ahead of the generated ones'."""
        result = out.stages.get(self.text_stage)
        if result is None or result.prompt_logprobs is None or completion is None:
            return completion
        token_ids, entries = result.prompt_token_ids, result.prompt_logprobs
        known = [e for e in entries if e is not None]
        texts = self._texts(token_ids, known)
        tokens = [texts[t][0] for t in token_ids]
        offsets = [sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]
        return {
            "tokens": tokens + completion["tokens"],
            "token_logprobs": [None if e is None else max(e.logprob, FLOOR) for e in entries]
            + completion["token_logprobs"],
            "top_logprobs": [
                None if e is None else {texts[i][0]: max(v, FLOOR) for i, v in e.top}
                for e in entries
            ]
            + completion["top_logprobs"],
            "text_offset": offsets + completion["text_offset"],
        }

    def new(self, out: OmniOutput) -> dict[str, Any] | None:
        """The logprobs of the text stage's tokens not yet returned (None: none were asked
        for, or the stage has not started)."""
        result = out.stages.get(self.text_stage)
        if result is None or result.logprobs is None:
            return None
        end = len(result.logprobs) - (result.finish_reason == "stopped")
        token_ids, entries = (
            result.token_ids[self.num_sent : end],
            result.logprobs[self.num_sent : end],
        )
        self.num_sent = max(self.num_sent, end)
        return self._chat(token_ids, entries) if self.chat else self._completion(token_ids, entries)

    def _texts(self, token_ids: list[int], entries: list[TokenLogprobs]) -> dict[int, tuple]:
        ids = set(token_ids) | {t for entry in entries for t, _ in entry.top}
        ordered = sorted(ids)
        return dict(
            zip(ordered, self.async_omni.token_texts(self.text_stage, ordered), strict=True)
        )

    def _chat(self, token_ids: list[int], entries: list[TokenLogprobs]) -> dict[str, Any]:
        texts = self._texts(token_ids, entries)

        def item(token_id: int, logprob: float) -> dict[str, Any]:
            text, raw = texts[token_id]
            return {"token": text, "logprob": max(logprob, FLOOR), "bytes": raw}

        content = [
            {**item(t, entry.logprob), "top_logprobs": [item(i, v) for i, v in entry.top]}
            for t, entry in zip(token_ids, entries, strict=True)
        ]
        return {"content": content, "refusal": None}

    def _completion(self, token_ids: list[int], entries: list[TokenLogprobs]) -> dict[str, Any]:
        texts = self._texts(token_ids, entries)
        tokens = [texts[t][0] for t in token_ids]
        offsets = []
        for text in tokens:
            offsets.append(self.text_offset)
            self.text_offset += len(text)
        return {
            "tokens": tokens,
            "token_logprobs": [max(entry.logprob, FLOOR) for entry in entries],
            "top_logprobs": [
                {texts[i][0]: max(v, FLOOR) for i, v in entry.top} for entry in entries
            ],
            "text_offset": offsets,
        }
