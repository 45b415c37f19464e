"""check_language: the ISO-639-1 codes the transcription endpoints and the realtime session's
input transcription take (a 400 naming the field otherwise)."""

from __future__ import annotations

import re

from omni.entrypoints.openai.errors import bad_request

_LANGUAGE = re.compile(r"[a-z]{2}")


def check_language(language: str | None, param: str) -> None:
    """A 400 naming `param` unless `language` is None or an ISO-639-1 code."""
    if language is not None and not _LANGUAGE.fullmatch(language):
        raise bad_request(f"{param}: an ISO-639-1 code (e.g. 'en'), got {language!r}", param)
