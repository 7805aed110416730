"""A turn's prompt cut to what the model takes, so that no conversation can grow into an error.

``Assistant.prompt`` keeps as much history as ``assistant_history_turns`` / ``assistant_history_tokens``
allow (an estimate in characters, no tokenizer). That estimate is not the limit: a tool result of
``mcp_max_result_chars`` with the tools' schemas and the system prompt can pass the model's
``llm_max_prompt_tokens``, and a conversation that keeps that result in its history would then fail
every later answer with ``context_length_exceeded``. ``fit`` measures the prompt as it will be sent
(``LlmService.prompt_tokens``: the engine's own chat template and tokenizer, or an upstream's
estimate) and, while it is too long, leaves out:

1. the oldest earlier turns, whole (the kept history still starts with a user message);
2. then the text of the tool results (the longest first), cut with a note saying how much is missing.

What is left after that (the system prompt, the user's message, the calls) is sent as it is: the
engine's error then names the real problem. Only the LLM's copy is cut: the conversation (the
Realtime items, the voice loop's history) keeps everything.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import replace

from mediaserver.errors import ApiError
from mediaserver.llm.prompt_size import message_bytes, prompt_bytes, text_bytes
from mediaserver.llm.service import LlmService
from mediaserver.llm.tools import ToolConfig
from mediaserver.llm.types import ChatMessage

log = logging.getLogger(__name__)

MAX_FIT_ROUNDS = 12  # counts of one prompt: each cut is sized from the last count, so a few suffice
CUT_SLACK_CHARS = 64  # a cut takes this much more than the excess at the prompt's characters a token


def cut_note(left_out: int, total: int) -> str:
    return f"\n[{left_out} of {total} characters left out here: the whole result does not fit the model's context]"


def _current_turn(messages: Sequence[ChatMessage], first: int) -> int:
    """Where the last turn starts: its user message (``first`` when there is none)."""
    for index in range(len(messages) - 1, first - 1, -1):
        if messages[index].role == "user":
            return index
    return first


def _drop_turns(messages: list[ChatMessage], first: int, bytes_needed: int) -> list[ChatMessage] | None:
    """Without the oldest earlier turns worth ``bytes_needed`` (at least one); None when there are none."""
    current = _current_turn(messages, first)
    if current <= first:
        return None
    end, dropped = first, 0
    while end < current and dropped < bytes_needed:
        dropped += message_bytes(messages[end])
        end += 1
        while end < current and messages[end].role != "user":  # whole turns: up to the next user message
            dropped += message_bytes(messages[end])
            end += 1
    return [*messages[:first], *messages[end:]]


class _Cuts:
    """The tool results' full texts, and how much of each is kept."""

    def __init__(self, messages: Sequence[ChatMessage]) -> None:
        self.full = {i: m.content for i, m in enumerate(messages) if m.role == "tool" and m.content}
        self.kept = {i: len(text) for i, text in self.full.items()}

    def cut(self, messages: list[ChatMessage], chars: int) -> bool:
        """Take about ``chars`` more characters out of the longest results; False: nothing is left to cut."""
        cut_any = False
        while chars > 0:
            candidates = [i for i, kept in self.kept.items() if kept > 0]
            if not candidates:
                break
            index = max(candidates, key=lambda i: self.kept[i])
            taken = min(chars, self.kept[index])
            self.kept[index] -= taken
            chars -= taken
            cut_any = True
            full, kept = self.full[index], self.kept[index]
            messages[index] = replace(messages[index], content=full[:kept] + cut_note(len(full) - kept, len(full)))
        return cut_any


async def fit(
    llm: LlmService, messages: Sequence[ChatMessage], tools: ToolConfig | None, model: str | None
) -> list[ChatMessage]:
    """``messages`` (the system prompt first) as they fit the model's prompt limit (see the module)."""
    fitted = list(messages)
    first = 1 if fitted and fitted[0].role == "system" else 0
    cuts: _Cuts | None = None
    for _ in range(MAX_FIT_ROUNDS):
        try:
            size = await llm.prompt_tokens(fitted, tools, model=model)
        except ApiError:
            return fitted  # an unknown or unavailable model: the generation says so
        if size.excess == 0:
            return fitted
        # The excess in characters, at this prompt's average a token (a denser result needs another
        # round): its text alone when the engine counted, the estimate's own rate otherwise.
        sized = text_bytes(fitted, tools) if size.exact else prompt_bytes(fitted, tools)
        chars_needed = math.ceil(size.excess * sized / max(1, size.tokens)) + CUT_SLACK_CHARS
        dropped = _drop_turns(fitted, first, chars_needed)
        if dropped is not None:
            log.info("prompt %d tokens over %d: the oldest turns are left out", size.tokens, size.limit)
            fitted = dropped
            continue
        if cuts is None:
            cuts = _Cuts(fitted)
        if not cuts.cut(fitted, chars_needed):
            return fitted
        log.info("prompt %d tokens over %d: tool results cut by %d characters", size.tokens, size.limit, chars_needed)
    return fitted
