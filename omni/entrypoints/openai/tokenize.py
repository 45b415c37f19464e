"""POST /tokenize and /detokenize, as vLLM serves them: a prompt's token ids in the root stage's
vocabulary (a text prompt, or chat messages framed as /v1/chat/completions frames them, so the
count is the chat prompt's, media placeholders included), and token ids back to text."""

from __future__ import annotations

import asyncio
from typing import Any

from omni.entrypoints.openai.context import Context
from omni.entrypoints.openai.errors import bad_request
from omni.entrypoints.openai.prompts import chat_prompt
from omni.entrypoints.openai.protocol import DetokenizeRequest, TokenizeRequest


async def tokenize(ctx: Context, body: TokenizeRequest) -> dict[str, Any]:
    if body.model is not None:
        ctx.check_model(body.model)
    if (body.prompt is None) == (body.messages is None):
        raise bad_request("give exactly one of prompt and messages", "prompt")
    async_omni = ctx.async_omni
    if async_omni.prompt_processor.tokenizer is None:
        raise bad_request(f"{ctx.args.model_name!r} has no tokenizer", "model", "unsupported")
    if body.messages is not None:
        prompt = await asyncio.to_thread(
            chat_prompt, async_omni.prompt_processor, body.messages, ctx.args
        )
    else:
        prompt = {"prompt": body.prompt}
        if body.add_special_tokens is False:
            prompt = {"prompt_token_ids": async_omni.tokenize(body.prompt)}
    prepared = await asyncio.to_thread(async_omni.prepare, prompt, "tokenize")
    token_ids = list(prepared.prompt_token_ids)
    root = async_omni.config.root_stages[0]
    return {"count": len(token_ids), "max_model_len": root.engine.max_model_len,
            "tokens": token_ids, "token_strs": None}  # fmt: skip


async def detokenize(ctx: Context, body: DetokenizeRequest) -> dict[str, Any]:
    """The text of the ids, special tokens included (the inverse of tokenize)."""
    if body.model is not None:
        ctx.check_model(body.model)
    tokenizer = ctx.async_omni.prompt_processor.tokenizer
    if tokenizer is None:
        raise bad_request(f"{ctx.args.model_name!r} has no tokenizer", "model", "unsupported")
    size = len(tokenizer)
    for i, token_id in enumerate(body.tokens):
        if token_id >= size:
            raise bad_request(
                f"tokens[{i}]: {token_id} is not in the vocabulary of {size} tokens", f"tokens[{i}]"
            )
    return {"prompt": await asyncio.to_thread(tokenizer.decode, list(body.tokens))}
