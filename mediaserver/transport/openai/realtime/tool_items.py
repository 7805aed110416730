"""A Realtime conversation's tool calls as output items, and the session's MCP servers.

A call the model makes is an output item after its round's message (``ResponseRounds.run``): a
``function_call`` (``response.function_call_arguments.delta`` / ``.done``; the client runs it and
answers with a ``function_call_output`` item) or, for a tool of one of the session's ``type: "mcp"``
servers, an ``mcp_call`` (``response.mcp_call_arguments.delta`` / ``.done``, then
``response.mcp_call.in_progress`` and ``.completed`` / ``.failed`` around the call, which runs here
through ``mcp_tools.SessionTools``). The servers are connected and listed (``mcp_list_tools`` items,
``mcp_list_tools.in_progress`` / ``.completed`` / ``.failed``) when the session's configuration
declares them; ``tools_for`` gives a round the functions and the listed tools.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from mediaserver.assistant.mcp import call_problem
from mediaserver.config import Settings
from mediaserver.llm.tools import ToolCall, ToolConfig
from mediaserver.metrics import Metrics
from mediaserver.transport.openai.realtime.input_transcription import Host
from mediaserver.transport.openai.realtime.items import Item, Items
from mediaserver.transport.openai.realtime.mcp_tools import McpTool, SessionTools, list_tools_item
from mediaserver.transport.openai.realtime.responses import Response
from mediaserver.transport.openai.realtime.values import new_id

# Announces an item added to (or done in) the conversation, after the item of the given id.
ItemEvent = Callable[[Item, "str | None"], None]


class ToolItems:
    """One conversation's call items and MCP servers."""

    def __init__(
        self, host: Host, settings: Settings, metrics: Metrics, items: Items, added: ItemEvent, done: ItemEvent
    ) -> None:
        self.host = host
        self.settings = settings
        self.metrics = metrics
        self.items = items
        self._on_added = added
        self._on_done = done
        self.mcp: SessionTools | None = None  # the session's MCP servers (type "mcp" tools)
        self._keys: tuple[object, ...] = ()
        self._listing: asyncio.Task[None] | None = None
        self._closed = False

    def open(self, response: Response, index: int, call_id: str, name: str) -> Item:
        """A call the model makes, as an output item after the round's message: a ``function_call``
        (the client runs it and answers with a ``function_call_output`` item and ``response.create``)
        or, for an MCP server's tool, an ``mcp_call`` (run here)."""
        item = response.open_calls.get(index)
        if item is not None:
            return item
        located = self.mcp.locate(name) if self.mcp is not None else None
        if located is not None:
            item = Item(new_id("item"), "assistant", "output_text", "", status="in_progress",
                        type="mcp_call", call_id=call_id, name=located[1], server_label=located[0])  # fmt: skip
        else:
            item = Item(new_id("item"), "assistant", "output_text", "", status="in_progress",
                        type="function_call", call_id=call_id, name=name)  # fmt: skip
        response.open_calls[index] = item
        response.output.append(item)
        ids = {"response_id": response.id}
        self.host.send(
            "response.output_item.added",
            **ids,
            output_index=response.index_of(item),
            item=item.describe(beta=self.host.beta),
        )
        if response.options.in_conversation:
            self._on_added(item, self.items.add(item))
        return item

    def delta(self, response: Response, index: int, call_id: str, name: str, arguments: str) -> None:
        item = self.open(response, index, call_id, name)
        if not arguments:
            return
        item.text = (item.text or "") + arguments
        where = {"response_id": response.id, "item_id": item.id, "output_index": response.index_of(item)}
        if item.type == "mcp_call":
            self.host.send("response.mcp_call_arguments.delta", **where, delta=arguments)
        else:
            self.host.send("response.function_call_arguments.delta", **where, call_id=item.call_id, delta=arguments)

    def arguments_done(self, response: Response, index: int, call: ToolCall) -> Item:
        """The call's whole arguments: the pieces not streamed yet, then the ``.done`` event."""
        item = self.open(response, index, call.id, call.name)
        arguments = call.arguments
        missing = arguments[len(item.text or "") :] if arguments.startswith(item.text or "") else ""
        if missing:
            self.delta(response, index, call.id, call.name, missing)
        item.text = arguments
        where = {"response_id": response.id, "item_id": item.id, "output_index": response.index_of(item)}
        if item.type == "mcp_call":
            self.host.send("response.mcp_call_arguments.done", **where, arguments=arguments)
        else:
            self.host.send(
                "response.function_call_arguments.done", **where, call_id=item.call_id, name=item.name,
                arguments=arguments,
            )  # fmt: skip
        return item

    def item_done(self, response: Response, item: Item) -> None:
        self.host.send(
            "response.output_item.done",
            response_id=response.id,
            output_index=response.index_of(item),
            item=item.describe(beta=self.host.beta),
        )
        if response.options.in_conversation and item.id in self.items:
            self._on_done(item, self.items.previous_id(item.id))

    def function_done(self, response: Response, index: int, call: ToolCall, *, cut: bool) -> None:
        """A function call of the client's, whole; ``cut``: the answer stopped at its token limit, and
        a call whose arguments it cut off (``call_problem``) is ``incomplete``, as the response is."""
        item = self.arguments_done(response, index, call)
        item.status = "incomplete" if cut and call_problem(call.arguments, cut=True) is not None else "completed"
        self.item_done(response, item)

    # --- MCP servers ---------------------------------------------------------------------------

    def set_mcp(self, declared: tuple[McpTool, ...]) -> None:
        """The session's MCP tools changed (or were first given): connect and list the new set."""
        keys = tuple(tool.key() for tool in declared)
        if keys == self._keys or self._closed:
            return
        self._keys = keys
        old, previous = self.mcp, self._listing
        self.mcp = SessionTools(declared, self.settings, self.metrics) if declared else None
        self._listing = self.host.spawn(self._list(old, previous, self.mcp), "realtime-mcp-list")

    async def _list(
        self, old: SessionTools | None, previous: asyncio.Task[None] | None, new: SessionTools | None
    ) -> None:
        if previous is not None and not previous.done():
            previous.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await previous
        if old is not None:
            await old.aclose()
        if new is None:
            return
        items: list[Item] = []
        for tool in new.declared:
            item = Item(new_id("item"), "assistant", "output_text", "", type="mcp_list_tools",
                        server_label=tool.label, tools=[])  # fmt: skip
            self._on_added(item, self.items.add(item))
            self.host.send("mcp_list_tools.in_progress", item_id=item.id)
            items.append(item)
        await new.start()
        for item in items:
            label = item.server_label or ""
            tools, problem = new.listing(label)
            if problem is None:
                item.tools = list_tools_item(item.id, label, tools)["tools"]
                self.host.send("mcp_list_tools.completed", item_id=item.id)
            else:
                self.host.send("mcp_list_tools.failed", item_id=item.id)
                self.host.send_error(
                    "mcp_list_tools_failed",
                    f"MCP server {label!r}: its tools could not be listed ({problem}); they are left out "
                    f"until it answers (tried again every {self.settings.mcp_reconnect_s:g} s).",
                    param="session.tools",
                    kind="server_error",
                )
            if item.id in self.items:
                self._on_done(item, self.items.previous_id(item.id))

    async def ready(self) -> None:
        """A response waits for the listing in progress (it ends within ``mcp_connect_timeout_s``)."""
        listing = self._listing
        if listing is not None and not listing.done():
            await asyncio.wait({listing})

    def is_mcp(self, name: str) -> bool:
        return self.mcp is not None and self.mcp.owns(name)

    def tools_for(self, response: Response, *, after_calls: bool) -> ToolConfig | None:
        """The tools of one round: the session's functions and its MCP servers' tools. After MCP
        calls the model may call again (``auto``) until ``mcp_max_calls_per_turn``; then only the
        functions are offered."""
        options = response.options
        mcp = self.mcp
        if mcp is None:
            return options.tools
        choice = options.tool_choice
        if choice == "none":
            return None
        functions = options.tools.tools if options.tools is not None else ()
        mcp_on = response.mcp_calls < self.settings.mcp_max_calls_per_turn
        specs = (*functions, *(mcp.tools() if mcp_on else ()))
        if not specs:
            return None
        if after_calls:
            return ToolConfig(specs, "auto")
        if isinstance(choice, dict) and choice.get("type") == "function":
            return ToolConfig(specs, str(choice.get("name")), forced=True)
        if isinstance(choice, dict) and choice.get("type") == "mcp":
            name = mcp.exposed(choice.get("server_label"), choice.get("name"))
            if name is not None:
                return ToolConfig(specs, name, forced=True)
            return ToolConfig(specs, "required" if choice.get("name") is None else "auto")
        return ToolConfig(specs, "required" if choice == "required" else "auto")

    async def run_mcp(self, response: Response, index: int, call: ToolCall, *, cut: bool = False) -> str:
        """Run one MCP call of the model's: the ``mcp_call`` item's events; the result for the model.
        ``cut``: the answer stopped at its token limit; a call cut off, or with arguments that are not
        an object, is not run (``call_problem``), and its result says why."""
        assert self.mcp is not None
        item = self.arguments_done(response, index, call)
        where = {"item_id": item.id, "output_index": response.index_of(item)}
        self.host.send("response.mcp_call.in_progress", **where)
        limit = self.settings.mcp_max_calls_per_turn
        if response.mcp_calls >= limit:
            text, is_error = (
                f"Error: not run, this answer already made {limit} tool calls (mcp_max_calls_per_turn); "
                "answer with what you have.",
                True,
            )
        else:
            response.mcp_calls += 1
            result = await self.mcp.call(call.name, call.arguments, refuse=call_problem(call.arguments, cut=cut))
            text, is_error = result.text, result.is_error
        if is_error:
            item.error = {"type": "tool_execution_error", "message": text.removeprefix("Error: ")}
            item.status = "incomplete"
            self.host.send("response.mcp_call.failed", **where)
        else:
            item.output, item.status = text, "completed"
            self.host.send("response.mcp_call.completed", **where)
        self.item_done(response, item)
        return text

    async def aclose(self) -> None:
        self._closed = True
        listing = self._listing
        if listing is not None and not listing.done():
            listing.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await listing
        if self.mcp is not None:
            await self.mcp.aclose()
