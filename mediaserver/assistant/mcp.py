"""Tools from MCP servers the operator configured (``mcp_servers``), for the assistant to call.

One ``McpToolbox`` per app. Each server gets a supervisor task that holds its MCP client session
(the ``mcp`` package: streamable HTTP with the configured headers, legacy SSE, or a stdio child
process) open, lists its tools, and reconnects after ``mcp_reconnect_s`` when the connection
breaks or the server was down at start. A server that is down simply has no tools meanwhile.

``call`` never raises for what a server does: a server that is down, slow (``mcp_call_timeout_s``)
or raises gives a ``ToolResult`` with ``is_error`` and a sentence the model can relay. Results are
cut to ``mcp_max_result_chars`` with a note saying so. Every call is logged with its duration
(arguments at debug level only) and counted in ``/metrics``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import weakref
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import Counter, Histogram

from mediaserver.config import McpServerConfig, Settings
from mediaserver.llm.tools import ToolCall, ToolSpec
from mediaserver.metrics import Metrics

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ToolResult:
    """What a call gives back to the model: text, and whether it is an error."""

    text: str
    is_error: bool = False
    duration_s: float = 0.0
    truncated: bool = False


_METRICS: weakref.WeakKeyDictionary[Metrics, ToolMetrics] = weakref.WeakKeyDictionary()


class ToolMetrics:
    def __init__(self, metrics: Metrics) -> None:
        self.calls = Counter(
            "mediaserver_tool_calls",
            "Tool calls by server, tool and outcome (ok, error, timeout, unavailable, refused)",
            ["server", "tool", "outcome"],
            registry=metrics.registry,
        )
        self.seconds = Histogram(
            "mediaserver_tool_call_seconds",
            "Duration of a tool call",
            ["server"],
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30),
            registry=metrics.registry,
        )

    @classmethod
    def of(cls, metrics: Metrics) -> ToolMetrics:
        found = _METRICS.get(metrics)
        if found is None:
            found = _METRICS[metrics] = cls(metrics)
        return found

    def finish(
        self, server: str, name: str, outcome: str, text: str, *, is_error: bool, started: float, max_chars: int
    ) -> ToolResult:
        """A call that ended ``outcome`` (counted and timed from ``started``), its text cut to
        ``max_chars`` with a note saying so: the result the model gets."""
        duration = time.monotonic() - started
        self.calls.labels(server, name, outcome).inc()
        self.seconds.labels(server).observe(duration)
        truncated = len(text) > max_chars
        if truncated:
            text = text[:max_chars] + f"\n[truncated: the result had {len(text)} characters, {max_chars} shown]"
        return ToolResult(text, is_error, duration, truncated)


def call_arguments(arguments: str) -> dict[str, Any] | str:
    """A call's arguments as the object a tool takes, or the error the model gets instead."""
    try:
        parsed = json.loads(arguments or "{}")
    except ValueError as exc:
        return f"Error: the arguments are not valid JSON ({exc})."
    return parsed if isinstance(parsed, dict) else "Error: the arguments must be a JSON object."


@dataclass
class _Server:
    config: McpServerConfig
    client: Any = None  # mcp.Client while connected
    tools: dict[str, ToolSpec] = field(default_factory=dict)
    problem: str | None = "not connected yet"
    task: asyncio.Task[None] | None = None
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    connected: asyncio.Event = field(default_factory=asyncio.Event)


def _transport(config: McpServerConfig) -> Any:
    """What ``mcp.Client`` connects through."""
    if config.command:
        from mcp.client.stdio import StdioServerParameters

        return StdioServerParameters(command=config.command, args=list(config.args), env=config.env or None)
    headers = {k: v.get_secret_value() for k, v in config.headers.items()}
    url = config.url or ""
    if config.transport == "sse":
        from mcp.client.sse import sse_client

        return sse_client(url, headers=headers)
    return _streamable_http(url, headers)


@contextlib.asynccontextmanager
async def _streamable_http(url: str, headers: dict[str, str]) -> AsyncIterator[Any]:
    """Streamable HTTP with headers: the transport over an HTTP client of ours, closed with it."""
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    async with (
        create_mcp_http_client(headers=headers) as http,
        streamable_http_client(url, http_client=http) as streams,
    ):
        yield streams


class McpToolbox:
    """The tools of every configured MCP server, by (unique) name."""

    def __init__(self, settings: Settings, metrics: Metrics) -> None:
        self.settings = settings
        self.metrics = ToolMetrics.of(metrics)
        self._servers = [_Server(config) for config in settings.mcp_servers]

    # --- lifecycle -------------------------------------------------------------------------------
    async def start(self) -> None:
        """Connect every server (waiting at most ``mcp_connect_timeout_s`` for them together)."""
        for server in self._servers:
            server.task = asyncio.create_task(self._supervise(server), name=f"mcp-{server.config.name}")
        if self._servers:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.settings.mcp_connect_timeout_s):
                    await asyncio.gather(*(s.connected.wait() for s in self._servers))

    async def aclose(self) -> None:
        for server in self._servers:
            server.stop.set()
        for server in self._servers:
            if server.task is not None:
                server.task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await server.task

    async def _supervise(self, server: _Server) -> None:
        from mcp import Client

        name = server.config.name
        while not server.stop.is_set():
            try:
                async with asyncio.timeout(self.settings.mcp_connect_timeout_s):
                    client_cm = Client(_transport(server.config))
                    client = await client_cm.__aenter__()
                try:
                    listing = await asyncio.wait_for(client.list_tools(), self.settings.mcp_call_timeout_s)
                    allowed = server.config.allowed_tools
                    server.tools = {
                        t.name: ToolSpec(t.name, t.description or "", t.input_schema or {"type": "object"})
                        for t in listing.tools
                        if allowed is None or t.name in allowed
                    }
                    server.client, server.problem = client, None
                    server.connected.set()
                    log.info("MCP server %s: connected, tools %s", name, ", ".join(server.tools) or "none")
                    await server.stop.wait()
                finally:
                    server.client = None
                    server.connected.clear()
                    with contextlib.suppress(Exception, asyncio.CancelledError):
                        await client_cm.__aexit__(None, None, None)
            except asyncio.CancelledError:
                raise
            except BaseException as exc:
                server.problem = f"{type(exc).__name__}: {exc}"
                log.warning("MCP server %s unavailable (%s); retrying in %g s", name, server.problem,
                            self.settings.mcp_reconnect_s)  # fmt: skip
            server.tools = {}
            server.connected.set()  # start() waits for a first answer, connected or not
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.settings.mcp_reconnect_s):
                    await server.stop.wait()

    # --- tools -----------------------------------------------------------------------------------
    def _names(self) -> dict[str, tuple[_Server, str]]:
        """Exposed name -> (server, the server's own name); a clash gets ``<server>__`` in front."""
        counts: dict[str, int] = {}
        for server in self._servers:
            for name in server.tools:
                counts[name] = counts.get(name, 0) + 1
        names: dict[str, tuple[_Server, str]] = {}
        for server in self._servers:
            for name in server.tools:
                names[f"{server.config.name}__{name}" if counts[name] > 1 else name] = (server, name)
        return names

    def tools(self) -> list[ToolSpec]:
        out = []
        for exposed, (server, name) in self._names().items():
            spec = server.tools[name]
            out.append(ToolSpec(exposed, spec.description, spec.parameters))
        return out

    # What ToolRounds' Toolbox protocol asks beyond tools(): the operator's mcp_tool_choice
    # holds, every tool runs here, and a call is run by name.
    tool_choice: tuple[str, bool] | None = None

    def client_side(self, name: str) -> bool:
        return False

    async def run(self, call: ToolCall) -> ToolResult:
        return await self.call(call.name, call.arguments)

    def status(self) -> dict[str, Any]:
        return {s.config.name: {"tools": sorted(s.tools), "problem": s.problem} for s in self._servers}

    def server_tools(self, server: str) -> tuple[list[ToolSpec], str | None]:
        """One server's tools under its own names, and why it has none (None: connected)."""
        for s in self._servers:
            if s.config.name == server:
                return list(s.tools.values()), s.problem
        return [], "no such server"

    def locate(self, name: str) -> tuple[str, str] | None:
        """An exposed tool name -> (its server's name, the server's own name for it)."""
        found = self._names().get(name)
        return (found[0].config.name, found[1]) if found is not None else None

    def exposed(self, server: str, tool: str) -> str | None:
        """The exposed name of ``server``'s tool ``tool`` (None: it has no such tool now)."""
        for exposed, (s, name) in self._names().items():
            if s.config.name == server and name == tool:
                return exposed
        return None

    async def call(self, name: str, arguments: str) -> ToolResult:
        started = time.monotonic()
        found = self._names().get(name)
        server_name = found[0].config.name if found else "-"

        def done(text: str, outcome: str, *, is_error: bool) -> ToolResult:
            limit = self.settings.mcp_max_result_chars
            result = self.metrics.finish(
                server_name, name, outcome, text, is_error=is_error, started=started, max_chars=limit
            )
            log.info("tool call %s on %s: %s in %.3f s", name, server_name, outcome, result.duration_s)
            log.debug("tool call %s arguments: %s", name, arguments)
            return result

        if found is None:
            return done(f"Error: there is no tool named {name!r}.", "refused", is_error=True)
        server, tool = found
        parsed = call_arguments(arguments)
        if isinstance(parsed, str):
            return done(parsed, "refused", is_error=True)
        client = server.client
        if client is None:
            return done(f"Error: the {server.config.name} service is unavailable.", "unavailable", is_error=True)
        timeout_s = self.settings.mcp_call_timeout_s
        try:
            async with asyncio.timeout(timeout_s):
                result = await client.call_tool(tool, parsed)
        except TimeoutError:
            return done(f"Error: {name} did not answer within {timeout_s:g} seconds.", "timeout", is_error=True)
        except Exception as exc:
            return done(f"Error: {name} failed: {exc}", "error", is_error=True)
        text = _result_text(result.content, result.structured_content)
        if result.is_error:
            return done(f"Error: {text}", "error", is_error=True)
        return done(text, "ok", is_error=False)


def _result_text(content: Sequence[Any], structured: Any) -> str:
    parts = []
    for block in content:
        text = getattr(block, "text", None)
        if isinstance(text, str):
            parts.append(text)
        else:
            parts.append(f"[{getattr(block, 'type', 'content')}]")
    if not parts and structured is not None:
        parts.append(json.dumps(structured))
    return "\n".join(parts)
