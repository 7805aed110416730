"""An answer's text as the LLM writes it: each piece goes out as an ``AssistantText`` event (held
with a speculative turn's), and into the answer's speech; the tool calls of a caller's tools as
``AssistantToolCallDelta`` events; the greeting of an enrolled speaker before the first clause.

Split from ``Assistant`` (turns.py), which runs it beside the answer's playback.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from mediaserver.assistant.greeting import Greeting
from mediaserver.assistant.tool_rounds import ToolRounds
from mediaserver.assistant.turn_types import StageFailed, Turn, VoiceMetrics
from mediaserver.config import Settings
from mediaserver.errors import ApiError
from mediaserver.events import AssistantText, AssistantToolCallDelta, SessionEvent
from mediaserver.llm.generation import LlmStream
from mediaserver.tts.service import Speech


class AnswerText:
    """One assistant's reader of its turns' LLM streams."""

    def __init__(
        self,
        settings: Settings,
        metrics: VoiceMetrics,
        emit: Callable[[SessionEvent], Awaitable[None]],
        turn_emit: Callable[[Turn, SessionEvent], Awaitable[None]],
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.emit = emit  # the session's events
        self.turn_emit = turn_emit  # a turn's events (a held turn's wait until it is released)

    async def read(
        self,
        turn: Turn,
        stream: LlmStream,
        speech: Speech | None,
        rounds: ToolRounds | None = None,
    ) -> None:
        """Read ``turn``'s answer (``rounds``: with MCP tools) to its end, feeding ``speech``; its
        usage, finish reason and calls go on the turn. An LLM error is the turn's ``StageFailed``."""
        first = True
        greeting = (
            Greeting(turn.greet, self.settings.assistant_greeting, self.settings.assistant_first_clause_words or 8)
            if turn.greet is not None
            else None
        )

        async def send(text: str) -> None:
            if not text:
                return
            turn.text += text
            await self.turn_emit(turn, AssistantText(turn.number, text, turn.text))
            if speech is not None:
                speech.feed(text)

        try:
            async for delta in self._deltas(turn, stream, rounds):
                if first:
                    first = False
                    since = turn.since_speech()
                    if since is not None and turn.held:  # a speculative answer's: counted if it is released
                        turn.first_token_pending = True
                    elif since is not None:
                        self.metrics.observe("llm_first_token", since)
                turn.progress_at = time.monotonic()
                await send(greeting.push(delta) if greeting is not None else delta)
            if greeting is not None:
                await send(greeting.end())
            last = rounds.last if rounds is not None and rounds.last is not None else stream
            # (usage_so_far: a generation the engine stopped on a cancel ends without a usage of its own)
            turn.usage, turn.finish_reason = last.usage_so_far, last.finish_reason
            if rounds is None:
                turn.tool_calls = tuple(last.tool_calls)
        except ApiError as exc:
            raise StageFailed("llm", exc.code, exc.message) from None
        except asyncio.CancelledError:
            # Cut midway (a barge-in, a Realtime response.cancel): the tokens taken so far, where
            # the backend says, are the turn's usage (response.done's), not none.
            if turn.usage is None:
                current = rounds.last if rounds is not None and rounds.last is not None else stream
                turn.usage = current.usage_so_far
            raise
        finally:
            if speech is not None and not speech.closed:
                speech.end()

    async def _deltas(self, turn: Turn, stream: LlmStream, rounds: ToolRounds | None) -> AsyncIterator[str]:
        """The answer's text. With tools the caller runs (``options.tools``), the calls' pieces go
        out as ``AssistantToolCallDelta`` events as they come; with MCP tools, ``rounds`` runs them."""
        if rounds is not None:
            async for delta in rounds.text(stream):
                yield delta
            return
        if turn.options.tools is None:
            async for delta in stream:
                yield delta
            return
        async for event in stream.events():
            if isinstance(event, str):
                yield event
            else:
                turn.progress_at = time.monotonic()
                await self.emit(AssistantToolCallDelta(turn.number, event.index, event.id, event.name, event.arguments))
