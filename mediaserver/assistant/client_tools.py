"""Tools the client runs: functions a page declares when it starts the assistant, called by the
model, answered by the page.

The page (a client of the WebRTC data channel; a device on the WebSocket ``/api/ws/asr`` the same
way, with ``tools`` in its ``start``) lists functions in ``start.obj.tools`` (the
Realtime shape ``{"type": "function", "name", "description", "parameters"}``, or Chat Completions'
with the function nested under ``"function"``) and may set ``tool_choice``. When the model calls one,
the call goes to the page (``assistant_tool_call`` with ``"client": true``) and the turn waits for
the page's ``tool_output`` with the call's ``call_id``; that text is the result the model answers
from. The wait ends with an error result for the model when the page takes longer than
``assistant_client_tool_timeout_s`` or goes away (``close``): the turn goes on, as it does when an
MCP server fails.

``SessionToolbox`` puts the page's tools beside the operator's (``McpToolbox``) for one session's
turns. The operator's win a clash: a page's tool named like one of them is refused at ``start``
(``check_clash``), and if a server offering that name connects later, the server's tool is the one
offered and called.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mediaserver.assistant.mcp import ToolMetrics, ToolResult, call_arguments
from mediaserver.assistant.tool_rounds import Toolbox
from mediaserver.config import Settings
from mediaserver.errors import InvalidParameter
from mediaserver.llm.tools import ToolCall, ToolConfig, ToolSpec, parse_tools
from mediaserver.metrics import Metrics

log = logging.getLogger(__name__)

SERVER_LABEL = "client"  # the ``server`` label of client calls in mediaserver_tool_calls_total


@dataclass(frozen=True)
class ClientTools:
    """A start message's tools, checked: the functions, and ``tool_choice`` as (choice, forced)."""

    specs: tuple[ToolSpec, ...]
    choice: tuple[str, bool] | None = None  # None: the operator's mcp_tool_choice


def _flat(tool: Any) -> Any:
    """A Chat Completions tool (``{"type": "function", "function": {...}}``) in the flat shape."""
    if isinstance(tool, dict) and isinstance(tool.get("function"), dict) and "name" not in tool:
        return {"type": tool.get("type"), **tool["function"]}
    return tool


def parse_client_tools(tools: Any, tool_choice: Any) -> ClientTools:
    """``start.obj``'s ``tools`` and ``tool_choice``; a clear ``InvalidParameter`` when they are wrong."""
    if tools is None:
        tools = []
    if not isinstance(tools, list):
        raise InvalidParameter("'tools' must be a list of functions", param="tools")
    flat = [_flat(tool) for tool in tools]
    choice = _flat(tool_choice)
    if choice == "none":  # no calls at all; the tools are still checked
        parse_tools(flat, None, None, flat=True)
        return ClientTools((), ("none", False))
    config: ToolConfig | None = parse_tools(flat, choice, None, flat=True)
    if config is None:
        return ClientTools(())
    return ClientTools(config.tools, (config.choice, config.forced) if tool_choice is not None else None)


@dataclass
class _Pending:
    name: str
    answer: asyncio.Future[tuple[str, str]]  # (text, outcome: ok, error, unavailable)


class ClientToolbox:
    """One session's page-run tools and the calls waiting for the page's answer."""

    def __init__(self, settings: Settings, metrics: Metrics, *, session_id: str = "") -> None:
        self.settings = settings
        self.metrics = ToolMetrics.of(metrics)
        self.session_id = session_id
        self.declared = ClientTools(())
        self._pending: dict[str, _Pending] = {}
        self._closed: str | None = None  # why no answer can come any more

    def declare(self, declared: ClientTools) -> None:
        """The page's tools from now on (a later ``start`` replaces them; calls waiting go on)."""
        self.declared = declared

    @property
    def tool_choice(self) -> tuple[str, bool] | None:
        return self.declared.choice

    def tools(self) -> list[ToolSpec]:
        return list(self.declared.specs)

    def names(self) -> set[str]:
        return {spec.name for spec in self.declared.specs}

    def client_side(self, name: str) -> bool:
        return name in self.names()

    async def run(self, call: ToolCall, refuse: str | None = None) -> ToolResult:
        return await self.call(call.name, call.arguments, call_id=call.id, refuse=refuse)

    @property
    def waiting(self) -> list[str]:
        """The call ids waiting for the page."""
        return list(self._pending)

    def answer(self, call_id: str, output: str, *, is_error: bool = False) -> bool:
        """The page's answer to ``call_id``; False when no call of that id is waiting (unknown,
        already answered, timed out or given up)."""
        pending = self._pending.get(call_id)
        if pending is None or pending.answer.done():
            return False
        if is_error:
            pending.answer.set_result((output if output.startswith("Error") else f"Error: {output}", "error"))
        else:
            pending.answer.set_result((output, "ok"))
        return True

    def close(self, reason: str = "the page disconnected") -> None:
        """No answer can come any more (the page went away): calls waiting end now, later ones at once."""
        if self._closed is None:
            self._closed = reason
        for pending in self._pending.values():
            if not pending.answer.done():
                pending.answer.set_result((f"Error: {pending.name} cannot run: {self._closed}.", "unavailable"))

    async def call(self, name: str, arguments: str, *, call_id: str = "", refuse: str | None = None) -> ToolResult:
        """Hand the call to the page and wait for its answer. Never raises for what the page does
        (or does not do): an error result for the model instead. The call was already announced to
        the page (``AssistantToolCall`` with ``client``; the transport sends it without waiting), and
        the answer is expected here before anything waits, so it cannot come too early."""
        started = time.monotonic()

        def done(text: str, outcome: str, *, is_error: bool) -> ToolResult:
            limit = self.settings.mcp_max_result_chars
            result = self.metrics.finish(
                SERVER_LABEL, name, outcome, text, is_error=is_error, started=started, max_chars=limit
            )
            log.info("%s: client tool call %s: %s in %.3f s", self.session_id, name, outcome, result.duration_s)
            log.debug("%s: client tool call %s arguments: %s", self.session_id, name, arguments)
            return result

        if refuse is not None:  # not handed to the page (``call_problem``)
            return done(f"Error: not run: {refuse}.", "refused", is_error=True)
        if name not in self.names():
            return done(f"Error: there is no tool named {name!r}.", "refused", is_error=True)
        problem = call_arguments(arguments)
        if isinstance(problem, str):
            return done(problem, "refused", is_error=True)
        if self._closed is not None:
            return done(f"Error: {name} cannot run: {self._closed}.", "unavailable", is_error=True)
        if not call_id or call_id in self._pending:
            return done(f"Error: {name} was called without a usable call id.", "refused", is_error=True)
        answer: asyncio.Future[tuple[str, str]] = asyncio.get_running_loop().create_future()
        self._pending[call_id] = _Pending(name, answer)
        timeout_s = self.settings.assistant_client_tool_timeout_s
        try:
            async with asyncio.timeout(timeout_s):
                text, outcome = await answer
        except TimeoutError:
            return done(f"Error: {name} did not answer within {timeout_s:g} seconds.", "timeout", is_error=True)
        finally:  # an answer after this (a timeout, the turn cancelled) is for an unknown call
            self._pending.pop(call_id, None)
        return done(text, outcome, is_error=outcome != "ok")


class SessionToolbox:
    """A session's tools: the operator's (MCP servers) and the page's, one ``Toolbox`` for ``ToolRounds``."""

    def __init__(self, client: ClientToolbox, operator: Toolbox | None) -> None:
        self.client = client
        self.operator = operator

    def _operator_names(self) -> set[str]:
        return {spec.name for spec in self.operator.tools()} if self.operator is not None else set()

    @property
    def tool_choice(self) -> tuple[str, bool] | None:
        return self.client.tool_choice

    def tools(self) -> list[ToolSpec]:
        if self.client.tool_choice == ("none", False):
            return []
        operator = self.operator.tools() if self.operator is not None else []
        taken = {spec.name for spec in operator}
        return [*operator, *(spec for spec in self.client.tools() if spec.name not in taken)]

    def client_side(self, name: str) -> bool:
        return self.client.client_side(name) and name not in self._operator_names()

    async def run(self, call: ToolCall, refuse: str | None = None) -> ToolResult:
        if self.client_side(call.name) or self.operator is None:
            return await self.client.run(call, refuse)
        return await self.operator.run(call, refuse)

    def check_clash(self, declared: ClientTools) -> None:
        """A page's tool may not take the name of one of the operator's (they win: refuse it now)."""
        taken = self._operator_names()
        for spec in declared.specs:
            if spec.name in taken:
                raise InvalidParameter(
                    f"tools: {spec.name!r} is already a tool of this server's MCP servers; give yours another name",
                    param="tools",
                )


def output_text(value: Any) -> str:
    """A ``tool_output``'s ``output`` as the model's text: a string as it is, anything else as JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value)


def unknown_call_text(call_id: str) -> str:
    """The error for a ``tool_output`` no call waits for (``ClientToolbox.answer`` said False)."""
    return f"tool_output: no tool call {call_id!r} is waiting for an answer (unknown, answered or timed out)"


def tool_output_fields(fields: Mapping[str, Any]) -> tuple[str, str, bool]:
    """(call_id, output, is_error) of a ``tool_output`` message, or ``InvalidParameter``."""
    call_id = fields.get("call_id")
    if not isinstance(call_id, str) or not call_id:
        raise InvalidParameter("tool_output needs 'call_id' (the id of the assistant_tool_call)", param="call_id")
    if "output" not in fields or fields["output"] is None:
        raise InvalidParameter("tool_output needs 'output' (the result, as text)", param="output")
    is_error = fields.get("is_error", False)
    if not isinstance(is_error, bool):
        raise InvalidParameter("'is_error' must be true or false", param="is_error")
    return call_id, output_text(fields["output"]), is_error
