"""fit: a realtime response's prompt within the text stage's context (`session.truncation`
"auto", OpenAI's default). When the conversation and the response's room (`max_output_tokens`,
or one token for "inf") overflow the stage's max_model_len, its oldest items leave the context,
for this response and every later one, until the prompt fills at most RETAIN of it: later turns
then start from the same items again, so their prompts stay in the prefix cache until the
context fills once more. A function call leaves with its outputs (chat templates expect a tool
turn to answer a call before it). The newest item is always kept; a conversation that does not
fit even then is refused as before (`context_length_exceeded`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from omni.entrypoints.openai import streaming
from omni.entrypoints.openai.context import Context
from omni.entrypoints.openai.realtime.conversation import Conversation, Item
from omni.messages import PromptInput

RETAIN = 0.75
"""The share of max_model_len a truncated prompt and its room fill at most."""


async def fit(
    ctx: Context,
    conversation: Conversation,
    items: list[Item],
    render: Callable[[list[Item]], dict[str, Any]],
    request_id: str,
    room: int,
) -> PromptInput:
    """`items` rendered and prepared, the oldest left out of context while they overflow."""
    stage = ctx.async_omni.config.stage(ctx.text_stage())
    limit = stage.engine.max_model_len
    prepared = await streaming.prepare(ctx.async_omni, render(items), request_id)
    if limit is None or stage.inputs or len(prepared.prompt_token_ids) + room <= limit:
        return prepared
    while len(prepared.prompt_token_ids) + room > RETAIN * limit:
        kept = [item for item in items if item.id not in conversation.out_of_context]
        leaving = leaving_items(kept)
        if len(leaving) >= len(kept):
            break
        conversation.out_of_context.update(leaving)
        prepared = await streaming.prepare(ctx.async_omni, render(items), request_id)
    return prepared


def leaving_items(kept: list[Item]) -> set[str]:
    """The ids of the oldest item in context and of the items that go with it."""
    first = kept[0]
    if first.type != "function_call":
        return {first.id}
    outputs = (i for i in kept if i.type == "function_call_output" and i.call_id == first.call_id)
    return {first.id, *(i.id for i in outputs)}
