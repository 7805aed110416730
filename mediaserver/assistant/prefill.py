"""The LLM engine's work ahead of a conversation's answers (llm/engine.py ``prefill``).

Two kinds, both in the background and both only into the slot the conversation's next request will
take (``SlotAffinity.peek``), never another conversation's:

- **the system prompt** (and tools) before a conversation's first turn, so that turn evaluates only
  the question;
- **the question while it is spoken** (``turn_prefill_partials``): at each partial decode, the
  prompt the answer will send, with the words so far, so the answer evaluates only what its final
  adds. One at a time; words that come meanwhile are prefilled after it, the latest only. None
  while an answer runs or is speculated: it would overwrite that answer's cache.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Sequence
from typing import Any, Protocol

from mediaserver.assistant.prompt import prompt_tools
from mediaserver.assistant.tool_rounds import Toolbox
from mediaserver.assistant.turn_types import AssistantOptions
from mediaserver.config import Settings
from mediaserver.llm.service import LlmService
from mediaserver.llm.types import ChatMessage


class _Conversation(Protocol):
    """What the prefills read of their ``Assistant`` (turns.py)."""

    llm: LlmService | None
    options: AssistantOptions
    settings: Settings
    speaker: str | None
    toolbox: Toolbox | None

    @property
    def history(self) -> list[ChatMessage]: ...

    @property
    def closed(self) -> bool: ...

    @property
    def answering(self) -> bool: ...

    def prompt(self, context: Sequence[ChatMessage], options: AssistantOptions | None = None) -> list[ChatMessage]: ...

    def messages(self, user_text: str) -> list[ChatMessage]: ...

    def spawn(self, work: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]: ...


class Prefills:
    """One conversation's prefills (its ``Assistant``'s)."""

    def __init__(self, conversation: _Conversation, name: str) -> None:
        self._conversation = conversation
        self._name = name
        self._question: asyncio.Task[None] | None = None  # the prefill of a question being spoken
        self._next: str | None = None  # the words to prefill after it

    def system_prompt(self, options: AssistantOptions | None = None, *, own_tools: bool = True) -> None:
        """Evaluate the conversation's system prompt (and tools) now. Nothing without an LLM, once
        closed, or once the conversation has begun. ``options``: another conversation's (a Realtime
        session's instructions); ``own_tools`` false: its turns list no tools of this assistant's (a
        Realtime response brings its own)."""
        conversation = self._conversation
        llm = conversation.llm
        if llm is None or conversation.closed or conversation.history:
            return
        options = options or conversation.options
        messages = conversation.prompt([], options)
        tools = (
            prompt_tools(options, conversation.settings, conversation.speaker, conversation.toolbox)
            if own_tools
            else options.tools
        )

        async def run() -> None:
            await llm.prefill(messages, tools, model=options.model)

        conversation.spawn(run(), f"assistant-prefill-{self._name}")

    def question(self, words: str) -> None:
        """The question being spoken reads ``words`` so far (a partial transcript): evaluate the
        prompt its answer will send. Nothing without an LLM, while an answer runs or is speculated,
        or once closed."""
        conversation = self._conversation
        llm = conversation.llm
        if llm is None or not words.strip() or conversation.closed or conversation.answering:
            return
        if self._question is not None:
            self._next = words
            return

        async def run(text: str | None) -> None:
            try:
                while text is not None and not (conversation.closed or conversation.answering):
                    options = conversation.options
                    messages = conversation.messages(text)
                    tools = prompt_tools(options, conversation.settings, conversation.speaker, conversation.toolbox)
                    await llm.prefill(messages, tools, model=options.model, question=True)
                    text, self._next = self._next, None
            finally:
                if self._question is asyncio.current_task():  # (now, not in a callback: no words lost)
                    self._question, self._next = None, None

        self._question = conversation.spawn(run(words), f"assistant-prefill-question-{self._name}")

    def stop(self) -> None:
        """An answer starts (or the conversation is forgotten): a question's prefill not yet sent to
        the engine would overwrite the answer's cache once the answer has it; it is dropped."""
        helper, self._question, self._next = self._question, None, None
        if helper is not None:
            helper.cancel()
