"""Chat messages -> the prompt dict AsyncOmni takes, as the server builds it: the shared
conversion (omni/entrypoints/chat_messages.py) under the server's media policy, a bad part
answered as an OpenAIError (400) that names it.

`chat_prompt` is public so that tests (and users) can build exactly the prompt the server builds.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from omni.engine.prompt_processor import PromptProcessor
from omni.entrypoints import chat_messages, media_parts
from omni.entrypoints.chat_messages import ChatMessage
from omni.entrypoints.media_parts import MediaError, MediaPolicy
from omni.entrypoints.openai.args import ServerArgs
from omni.entrypoints.openai.errors import bad_request


def media_policy(args: ServerArgs) -> MediaPolicy:
    """The server's media policy (its --allowed-local-media-path, --allow-remote-media, ...)."""
    return MediaPolicy(
        allowed_local_media_path=args.allowed_local_media_path,
        allow_remote_media=args.allow_remote_media,
        media_timeout_s=args.media_timeout_s,
        max_media_bytes=args.max_media_bytes,
    )


def chat_prompt(
    framing: PromptProcessor | Any,
    messages: Sequence[ChatMessage | dict[str, Any]],
    args: ServerArgs | None = None,
    tools: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The prompt for `messages` (ChatMessage models or the equivalent dicts), framed by
    `framing`: the pipeline's prompt processor, or a tokenizer. `args` is the media policy
    (default: data: URLs only); `tools` go to the chat template. Raises OpenAIError (400)
    naming a bad part."""
    policy = media_policy(args or ServerArgs(model_name=""))
    try:
        return chat_messages.chat_prompt(framing, messages, policy, tools)
    except MediaError as e:
        raise bad_request(e.message, e.param, e.code) from None


def load_image(url: str, param: str, args: ServerArgs) -> bytes:
    """An image URL's bytes under the server's media policy (OpenAIError 400 naming `param`)."""
    try:
        return media_parts.load_image(url, param, media_policy(args))
    except MediaError as e:
        raise bad_request(e.message, e.param, e.code) from None


def decode_base64(data: str, param: str) -> bytes:
    """Base64 `data` decoded (OpenAIError 400 naming `param` when it is not base64)."""
    try:
        return media_parts.decode_base64(data, param)
    except MediaError as e:
        raise bad_request(e.message, e.param, e.code) from None
