"""The voice loop's tool calls: the answer's text, across as many LLM rounds as its tool calls need.

``ToolRounds.text(stream)`` yields the text deltas of the first generation; when it ends with tool
calls, each call runs in the ``Toolbox`` (the MCP servers' ``McpToolbox``, and on WebRTC the page's
own tools beside them, ``client_tools.SessionToolbox``: errors, timeouts and a server or page that is
gone come back as error results, never exceptions), the calls and their results join the
messages, and the next generation's text follows, until an answer without calls. The turn's
speech is fed from this one iterator, so the answer after a call is spoken like any other.

A call that cannot run (cut off at the answer's token cap, or arguments that are not a JSON object)
is not run, nor handed to the client: its result is an error saying why, so the model may answer or
call again. At most ``mcp_max_calls_per_turn`` calls are made in one turn, those included: a call
past it is answered with an error result saying so, and the last round is generated without
tools, so a model that keeps calling cannot loop. Every call and result is emitted
(``AssistantToolCall``, ``AssistantToolResult``), which the transports show to the client; a call
the client must run itself says so (``client``). A speculative answer (not yet released) runs no
tool before it is: nothing acts on a turn that may not be over.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import replace
from typing import Protocol

from mediaserver.assistant.mcp import ToolResult, call_problem
from mediaserver.assistant.prompt_fit import fit
from mediaserver.assistant.speaker_context import current_speaker
from mediaserver.events import AssistantToolCall, AssistantToolResult, SessionEvent
from mediaserver.llm.generation import LlmStream
from mediaserver.llm.service import LlmService
from mediaserver.llm.tools import ToolCall, ToolConfig, ToolSpec, engine_arguments
from mediaserver.llm.types import ChatMessage, GenerationParams

log = logging.getLogger(__name__)


class Toolbox(Protocol):
    """What ``ToolRounds`` needs of the tools it offers (``McpToolbox``, ``client_tools.SessionToolbox``)."""

    @property
    def tool_choice(self) -> tuple[str, bool] | None:
        """(choice, forced: it names a function) for the first round; None: ``mcp_tool_choice``."""
        ...

    def tools(self) -> list[ToolSpec]: ...

    def client_side(self, name: str) -> bool:
        """The client runs ``name`` (its call is announced with ``client``, its answer awaited)."""
        ...

    async def run(self, call: ToolCall, refuse: str | None = None) -> ToolResult:
        """Run a call; never raises for what the tool does (an error result instead). ``refuse``: do
        not run it, nor hand it to the client; its result says why (counted as refused)."""
        ...


async def _now() -> None:
    return None


class ToolRounds:
    def __init__(
        self,
        llm: LlmService,
        toolbox: Toolbox,
        messages: list[ChatMessage],
        params: GenerationParams,
        model: str | None,
        emit: Callable[[SessionEvent], Awaitable[None]],
        turn: int,
        max_calls: int,
        on_progress: Callable[[], None],
        ready: Callable[[], Awaitable[None]] = _now,
    ) -> None:
        self.llm = llm
        self.toolbox = toolbox
        self.messages = list(messages)
        self.params = params
        self.model = model
        self._emit = emit
        self.turn = turn
        self.max_calls = max_calls
        self._progress = on_progress
        self._ready = ready  # returns once the turn may act (a speculative one: once released)
        self.calls = 0
        self.last: LlmStream | None = None

    @staticmethod
    def config(toolbox: Toolbox, choice: str, *, forced: bool = False) -> ToolConfig | None:
        tools = tuple(toolbox.tools())
        return ToolConfig(tools, choice, forced) if tools else None

    async def text(self, stream: LlmStream) -> AsyncGenerator[str, None]:
        """The answer's text deltas, across rounds. ``stream`` is the first round, already open
        (its caller closes it); later rounds are opened and closed here."""
        current = stream
        while True:
            self.last = current
            said: list[str] = []
            try:
                async for delta in current:  # text only; the stream collects the calls
                    said.append(delta)
                    yield delta
            finally:
                if current is not stream:
                    await current.aclose()
            calls = current.tool_calls
            if not calls:
                return
            # The history's copy of a call cut off or malformed is one any backend renders (``{}``).
            written = tuple(replace(call, arguments=engine_arguments(call.arguments)) for call in calls)
            self.messages.append(ChatMessage("assistant", "".join(said), written))
            await self._ready()
            cut = current.finish_reason == "length"
            for call in calls:
                unusable = call_problem(call.arguments, cut=cut)
                client = unusable is None and self.calls < self.max_calls and self.toolbox.client_side(call.name)
                await self._emit(
                    AssistantToolCall(
                        self.turn, call.id, call.name, call.arguments, client=client, speaker=current_speaker.get()
                    )
                )
                if self.calls >= self.max_calls:
                    result_text = (
                        f"Error: not run, this answer already made {self.max_calls} tool calls "
                        "(mcp_max_calls_per_turn); answer with what you have."
                    )
                    is_error = True
                    log.warning("turn %d: tool call %s refused: %d calls already", self.turn, call.name, self.calls)
                else:
                    self.calls += 1  # a call not run counts too: a model that keeps cutting its calls cannot loop
                    result = await self.toolbox.run(call, unusable)
                    result_text, is_error = result.text, result.is_error
                    if unusable is not None:
                        log.warning("turn %d: tool call %s not run: %s", self.turn, call.name, unusable)
                self._progress()
                await self._emit(AssistantToolResult(self.turn, call.id, call.name, result_text, is_error))
                self.messages.append(ChatMessage("tool", result_text, tool_call_id=call.id))
            # After the calls: let the model call again while it may, else answer without tools.
            tools = self.config(self.toolbox, "auto") if self.calls < self.max_calls else None
            params = replace(self.params, tools=tools)
            # The results may not all fit the model: its copy is cut to fit (prompt_fit.py).
            messages = await fit(self.llm, self.messages, tools, self.model)
            current = self.llm.stream(messages, params, model=self.model)
