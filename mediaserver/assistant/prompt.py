"""The prompt of an assistant turn: the system prompt, then as much recent history as the budget allows.

The budget counts what is sent: the system prompt, the tools' schemas, each message's text, calls
and template markers (``llm/prompt_size.py``), at ``CHARS_PER_TOKEN``. It is an estimate (no
tokenizer is needed for it); the turn then fits the prompt to the model's limit exactly
(``prompt_fit.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

from mediaserver.assistant.speaker_tools import gated
from mediaserver.assistant.tool_rounds import Toolbox, ToolRounds
from mediaserver.assistant.turn_types import AssistantOptions
from mediaserver.config import Settings
from mediaserver.llm.prompt_size import message_bytes, prompt_bytes
from mediaserver.llm.tools import ToolConfig
from mediaserver.llm.types import ChatMessage

CHARS_PER_TOKEN = 4  # the history budget is estimated in characters


def build_prompt(
    context: Sequence[ChatMessage],
    options: AssistantOptions,
    settings: Settings,
    speaker: str | None,
    toolbox: Toolbox | None,
) -> list[ChatMessage]:
    """The system prompt (naming ``speaker``, an enrolled voice), then the last message of
    ``context`` and as many before it as ``options``' history budget allows: whole turns, at most
    ``history_turns``, so the kept history never starts with an answer."""
    # Always a system prompt: a small model without one wanders (an empty one means the default).
    prompt = options.system_prompt.strip() or settings.assistant_system_prompt
    if speaker is not None:
        prompt += f"\nThe person speaking to you is {speaker}."
    system = [ChatMessage("system", prompt)]
    if not context:
        return system
    *earlier, last = context
    tools = prompt_tools(options, settings, speaker, toolbox)
    budget = options.history_tokens * CHARS_PER_TOKEN - prompt_bytes([*system, last], tools)
    turns = kept_turns(sum(m.role == "user" for m in earlier), options.history_turns, options.history_drop_turns)
    return [*system, *recent(earlier, budget, turns), last]


def kept_turns(earlier_turns: int, max_turns: int, drop_turns: int) -> int:
    """How many of ``earlier_turns`` user turns a prompt keeps: all up to ``max_turns``; past it the
    oldest go ``drop_turns`` at a time (``assistant_history_drop_turns``), so the kept history keeps
    its start, which the engine's prompt cache holds, until the next drop (at most ``max_turns``,
    never fewer than ``max_turns - drop_turns + 1``)."""
    if earlier_turns <= max_turns:
        return earlier_turns
    step = max(1, min(drop_turns, max_turns))
    dropped = -(-(earlier_turns - max_turns) // step) * step  # a whole number of steps
    return earlier_turns - dropped


def prompt_tools(
    options: AssistantOptions, settings: Settings, speaker: str | None, toolbox: Toolbox | None
) -> ToolConfig | None:
    """The tools a turn's prompt lists: the client's own, else the MCP tools ``speaker`` may use."""
    allowed = gated(toolbox, settings.speaker_tools, speaker)
    if options.tools is None and allowed is not None:
        return ToolRounds.config(allowed, "auto")
    return options.tools


def recent(earlier: Sequence[ChatMessage], budget: int, max_turns: int) -> list[ChatMessage]:
    """The latest messages of ``earlier`` that fit ``budget`` bytes and ``max_turns`` user turns,
    starting at a user message."""
    kept: list[ChatMessage] = []
    turns = 0
    for message in reversed(earlier):
        if message.role == "user":
            turns += 1
        size = message_bytes(message)
        if turns > max_turns or budget - size < 0:
            break
        budget -= size
        kept.append(message)
    while kept and kept[-1].role != "user":  # never start the kept history mid-turn
        kept.pop()
    return kept[::-1]
