"""Stop strings (SamplingParams.stop), matched by the driver on the decoded text of a request's
final stage, as OpenAI and vLLM match them (on text, not token ids: a stop string may span
tokens, or sit inside one).

After each step the router looks for them in the stage's text (decoded incrementally: only what
is new is searched, with the overlap a string may straddle). On a match the stage's request is
aborted and the driver finishes it itself: finish_reason "stopped", the tokens up to the one that
completed the string, the text before it (through it with include_stop_str_in_output). Until
then, a streamed snapshot holds back the end of its text that could be the beginning of a stop
string, so no client ever sees part of one.
Only the final stage may set them (its result is the driver's to cut), and its tokens must be
text: `stop_strings_for` refuses other requests before any work starts. With min_tokens, as vLLM:
the text of the steps before the request has that many tokens is passed over, not searched.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping

from omni.config import OmniConfig
from omni.core.sampling_params import SamplingParams
from omni.registry import produces_text


class StopStrings:
    def __init__(
        self, strings: tuple[str, ...], min_tokens: int = 0, include: bool = False
    ) -> None:
        self.strings = strings
        self.min_tokens = min_tokens  # SamplingParams.min_tokens: text before it is not searched
        self.include = include  # SamplingParams.include_stop_str_in_output
        self.longest = max(len(s) for s in strings)
        self.num_checked = 0  # characters of the text searched so far

    def find(self, text: str) -> tuple[int, int] | None:
        """(start, end) of the earliest stop string in `text`, a longer version of the text
        given before (None: no stop string yet)."""
        start = max(0, self.num_checked - self.longest + 1)
        self.num_checked = len(text)
        hits = [(i, i + len(s)) for s in self.strings if (i := text.find(s, start)) >= 0]
        return min(hits) if hits else None

    def held_back(self, text: str) -> str:
        """`text` without its longest end that is the beginning of a stop string."""
        cut = 0
        for s in self.strings:
            for k in range(min(len(s) - 1, len(text)), cut, -1):
                if text.endswith(s[:k]):
                    cut = k
                    break
        return text[: len(text) - cut]


def stopped_tokens(
    token_ids: list[int], end: int, decode: Callable[[list[int]], str | None]
) -> int:
    """The fewest leading tokens whose text reaches `end` characters (the stop string's end)."""
    n = len(token_ids)
    while n > 1 and len(decode(token_ids[: n - 1]) or "") >= end:
        n -= 1
    return n


def stop_strings_for(
    config: OmniConfig, params: Mapping[str, SamplingParams], final: str, needed: Collection[str]
) -> StopStrings | None:
    """The request's stop strings (its final stage's), or None; a ValueError naming the stage
    when a stage it runs that is not its final one sets some, or the final one's tokens are not
    text."""
    for stage in needed:
        if params[stage].stop and stage != final:
            raise ValueError(
                f"SamplingParams.stop of stage {stage!r}: stop strings end the request's final "
                f"stage only ({final!r}); give that stage's SamplingParams the stop strings, or "
                "stop_token_ids to this one"
            )
    strings = params[final].stop
    if strings and not produces_text(config.stage(final).adapter):
        raise ValueError(
            f"SamplingParams.stop of stage {final!r}: its tokens are not text (adapter "
            f"{config.stage(final).adapter!r}); use stop_token_ids"
        )
    if not strings:
        return None
    return StopStrings(strings, params[final].min_tokens, params[final].include_stop_str_in_output)
