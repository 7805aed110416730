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
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import Counter, Histogram

from mediaserver.assistant.speaker_context import MCP_META_KEY, current_speaker
from mediaserver.config import McpServerConfig, Settings
from mediaserver.llm.tools import ToolCall, ToolSpec, json_object, not_json
from mediaserver.metrics import Metrics

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ToolResult:
    """What a call gives back to the model: text, and whether it is an error. A result cut to
    ``mcp_max_result_chars`` says so in its text (the note the model and the client both see)."""

    text: str
    is_error: bool = False
    duration_s: float = 0.0


_METRICS: weakref.WeakKeyDictionary[Metrics, ToolMetrics] = weakref.WeakKeyDictionary()


class ToolMetrics:
    def __init__(self, metrics: Metrics) -> None:
        self.calls = Counter(
            "mediaserver_tool_calls",
            "Tool calls by server, tool and outcome (ok, error, timeout, unavailable, refused, cancelled)",
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
        if len(text) > max_chars:
            text = text[:max_chars] + f"\n[truncated: the result had {len(text)} characters, {max_chars} shown]"
        return ToolResult(text, is_error, duration)


def call_arguments(arguments: str) -> dict[str, Any] | str:
    """A call's arguments as the object a tool takes, or the error the model gets instead."""
    parsed = json_object(arguments)
    if parsed is not None:
        return parsed
    try:
        json.loads(arguments, parse_constant=not_json)
    except ValueError as exc:
        return f"Error: the arguments are not valid JSON ({exc})."
    return "Error: the arguments must be a JSON object."


def call_problem(arguments: str, *, cut: bool) -> str | None:
    """Why a call the model made cannot run (None: it can). ``cut``: its generation stopped at the
    token limit (finish ``length``), so arguments that are not a whole object, or blank (not begun),
    were cut off; otherwise arguments that are not a JSON object. Such a call is not run nor handed
    to a client: its result is an error saying why (the voice loop's ``ToolRounds``, Realtime)."""
    parsed = call_arguments(arguments)
    if cut and (isinstance(parsed, str) or not arguments.strip()):
        return "the call was cut off where the answer reached its token limit"
    if isinstance(parsed, str):
        return parsed.removeprefix("Error: ").rstrip(".")
    return None


@dataclass
class _Server:
    config: McpServerConfig
    client: Any = None  # mcp.Client while connected
    tools: dict[str, ToolSpec] = field(default_factory=dict)
    problem: str | None = "not connected yet"
    task: asyncio.Task[None] | None = None
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    connected: asyncio.Event = field(default_factory=asyncio.Event)
    # Where its HTTP requests may go (a redirect elsewhere is refused); None: the MCP client's own
    # rule (redirects within the URL's origin).
    url_allowed: Callable[[str], bool] | None = None
    http_error: str | None = None  # the last HTTP error status of the current connection, in words
    # Set to end the current connection (stop, or a call found it closed: a stdio server whose
    # process died), with why.
    drop: asyncio.Event = field(default_factory=asyncio.Event)
    dropped: str | None = None
    checks: int = 0  # liveness checks (``mcp_check_s``) it answered


class RedirectRefused(Exception):
    """A redirect to a URL the server may not reach (``url_allowed``); it is not followed."""


def _transport(server: _Server) -> Any:
    """What ``mcp.Client`` connects through."""
    config = server.config
    if config.command:
        from mcp.client.stdio import StdioServerParameters

        return StdioServerParameters(command=config.command, args=list(config.args), env=config.env or None)
    headers = {k: v.get_secret_value() for k, v in config.headers.items()}
    url = config.url or ""
    if config.transport == "sse":
        from mcp.client.sse import sse_client

        return sse_client(url, headers=headers)
    return _streamable_http(url, headers, server)


@contextlib.asynccontextmanager
async def _streamable_http(url: str, headers: dict[str, str], server: _Server) -> AsyncIterator[Any]:
    """Streamable HTTP with headers: the transport over an HTTP client of ours, closed with it. Its
    hooks refuse a request to a URL the server may not reach (a redirect out of a Realtime client's
    allowed prefix) and note an HTTP error status, which the MCP client reports only as "Server
    returned an error response" or "Not Found"."""
    import httpx2
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    server.http_error = None

    async def check(request: httpx2.Request) -> None:
        if server.url_allowed is not None and not server.url_allowed(str(request.url)):
            where = request.url.copy_with(userinfo=b"", query=None, fragment=None)
            raise RedirectRefused(f"a redirect to {where} is outside the URL allowed for this server; not followed")

    async def note(response: httpx2.Response) -> None:
        if response.status_code >= 400:
            server.http_error = _http_error(response.status_code, response.reason_phrase, str(response.request.url))

    async with create_mcp_http_client(headers=headers) as http:
        http.event_hooks = {"request": [check], "response": [note]}
        async with streamable_http_client(url, http_client=http) as streams:
            yield streams


class McpToolbox:
    """The tools of every configured MCP server, by (unique) name."""

    def __init__(
        self, settings: Settings, metrics: Metrics, *, url_allowed: Mapping[str, Callable[[str], bool]] | None = None
    ) -> None:
        """``url_allowed``: by server name, where its HTTP requests may go (a Realtime client's
        server: under the prefix that allowed it); a redirect elsewhere is not followed."""
        self.settings = settings
        self.metrics = ToolMetrics.of(metrics)
        guards = url_allowed or {}
        self._servers = [_Server(config, url_allowed=guards.get(config.name)) for config in settings.mcp_servers]

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
            server.drop.set()
        for server in self._servers:
            if server.task is not None:
                server.task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await server.task

    async def _supervise(self, server: _Server) -> None:
        """Keep ``server`` connected: each connection runs in a task of its own (``_connection``),
        since the MCP client's task group cancels the task that entered it when the transport
        breaks (a server that dies during a call); that ends the connection, not the supervisor.
        A server that goes away is logged (WARNING) and its tools are withdrawn; it is tried
        again every ``mcp_reconnect_s``, and its return is logged (WARNING) too."""
        name = server.config.name
        retry_s = self.settings.mcp_reconnect_s
        away = False  # it was up, or tried, and is not up now: the next connection is a return
        while not server.stop.is_set():
            up = asyncio.Event()  # set while the connection task holds a listed session
            connection = asyncio.create_task(self._connection(server, up, back=away), name=f"mcp-{name}-connection")
            try:
                await asyncio.wait({connection})
            except asyncio.CancelledError:
                connection.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await connection
                raise
            server.client, server.tools = None, {}
            if server.stop.is_set():
                if not connection.cancelled():
                    connection.exception()  # retrieved: an error while stopping is no news
                break
            reason = _ended(connection, server.http_error, server.dropped)
            server.problem = reason
            if up.is_set():
                log.warning("MCP server %s went away (%s); its tools are withdrawn until it is back, tried again "
                            "every %g s", name, reason, retry_s)  # fmt: skip
            elif not away:
                log.warning("MCP server %s unavailable (%s); trying again every %g s", name, reason, retry_s)
            else:
                log.debug("MCP server %s still unavailable (%s)", name, reason)
            away = True
            server.connected.set()  # start() waits for a first answer, connected or not
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(retry_s):
                    await server.stop.wait()

    async def _connection(self, server: _Server, up: asyncio.Event, *, back: bool) -> None:
        """One connection to ``server``: connect, list its tools, hold the session until ``drop``
        (stopping, or a call found it closed) or until the transport breaks, which cancels this
        task or raises out of it."""
        from mcp import Client

        name = server.config.name
        server.drop, server.dropped = asyncio.Event(), None
        if server.stop.is_set():
            return
        async with contextlib.AsyncExitStack() as stack:
            async with asyncio.timeout(self.settings.mcp_connect_timeout_s):
                client = await stack.enter_async_context(Client(_transport(server)))
                async with asyncio.timeout(self.settings.mcp_call_timeout_s):
                    listing = await client.list_tools()
            server.tools = _specs(listing, server.config.allowed_tools)
            server.client, server.problem = client, None
            up.set()
            server.connected.set()
            tools = ", ".join(server.tools) or "none"
            if back:
                log.warning("MCP server %s is back: tools %s", name, tools)
            else:
                log.info("MCP server %s: connected, tools %s", name, tools)
            try:
                await self._hold(server, client)
            finally:
                server.client, server.tools = None, {}

    async def _hold(self, server: _Server, client: Any) -> None:
        """Hold the connection until ``drop``, asking the server for its tools every ``mcp_check_s``:
        an HTTP server that died is otherwise noticed only when a user's call fails on it, its
        tools offered meanwhile. (Not MCP's ``ping``: protocol 2026-07-28 removed it, and a live
        server answers it "Method not found".) An answer, an error reply included, is a live
        server, and a changed listing is taken; the transport failing, or two listings in a row
        unanswered within ``mcp_call_timeout_s`` (one may wait behind a slow call), ends the
        connection."""
        from mcp import MCPError

        every_s, timeout_s = self.settings.mcp_check_s, self.settings.mcp_call_timeout_s
        if every_s <= 0:  # no checks: held until dropped
            await server.drop.wait()
            return
        missed = 0
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(every_s):
                    await server.drop.wait()
                    return
            try:
                async with asyncio.timeout(timeout_s):
                    listing = await client.list_tools(cache_mode="bypass")
            except TimeoutError:
                missed += 1
                if missed >= 2:
                    server.dropped = f"no answer to two tool listings in a row, each within {timeout_s:g} s"
                    return
                continue
            except MCPError as exc:
                if _closed(exc):
                    server.dropped = f"the connection closed ({exc})"
                    return
                missed = 0  # an error reply: the server is there
                continue
            except Exception as exc:
                server.dropped = f"its tools could not be listed ({failure(exc, server.http_error)})"
                return
            missed = 0
            server.checks += 1
            if server.client is client:
                server.tools = _specs(listing, server.config.allowed_tools)

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

    async def run(self, call: ToolCall, refuse: str | None = None) -> ToolResult:
        return await self.call(call.name, call.arguments, refuse=refuse)

    def status(self) -> dict[str, Any]:
        """Each server: ``up`` (connected, its tools listed) or ``down`` (and why), its tools (under
        their own names) (/health's ``mcp``)."""
        return {
            s.config.name: {
                "state": "up" if s.client is not None else "down",
                "tools": sorted(s.tools),
                "problem": s.problem if s.client is None else None,
            }
            for s in self._servers
        }

    def checks(self, server: str) -> int:
        """How many liveness checks (``mcp_check_s``) ``server`` has answered."""
        return sum(s.checks for s in self._servers if s.config.name == server)

    @property
    def down(self) -> list[str]:
        """The servers not connected now."""
        return [s.config.name for s in self._servers if s.client is None]

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

    async def call(self, name: str, arguments: str, *, refuse: str | None = None) -> ToolResult:
        """Run ``name``; ``refuse``: do not, the reason why (``call_problem``), counted ``refused``."""
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

        if refuse is not None:
            return done(f"Error: not run: {refuse}.", "refused", is_error=True)
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
                speaker = current_speaker.get()
                meta = {MCP_META_KEY: speaker} if speaker is not None else None  # the request's _meta
                result = await client.call_tool(tool, parsed, meta=meta)
        except TimeoutError:
            return done(f"Error: {name} did not answer within {timeout_s:g} seconds.", "timeout", is_error=True)
        except asyncio.CancelledError:  # the caller gave up (a Realtime response.cancel, a barge-in)
            done(f"Error: {name} was cancelled.", "cancelled", is_error=True)
            raise
        except Exception as exc:
            if _closed(exc):  # the server is gone (a stdio process that died, an HTTP server down)
                if server.client is client:
                    server.dropped = f"a call found the connection closed ({exc})"
                    server.drop.set()
                text = f"Error: the {server.config.name} service is unavailable ({name} failed: {exc})."
                return done(text, "unavailable", is_error=True)
            return done(f"Error: {name} failed: {exc}", "error", is_error=True)
        text = _result_text(result.content, result.structured_content)
        if result.is_error:
            return done(f"Error: {text}", "error", is_error=True)
        return done(text, "ok", is_error=False)


def _specs(listing: Any, allowed: Sequence[str] | None) -> dict[str, ToolSpec]:
    """A server's listed tools (only ``allowed`` ones, when the operator named them), by name."""
    return {
        t.name: ToolSpec(t.name, t.description or "", t.input_schema or {"type": "object"})
        for t in listing.tools
        if allowed is None or t.name in allowed
    }


def _closed(exc: Exception) -> bool:
    """Whether a call failed because the connection to its server is closed."""
    from mcp import MCPError
    from mcp_types import CONNECTION_CLOSED

    return isinstance(exc, MCPError) and exc.code == CONNECTION_CLOSED


def _ended(connection: asyncio.Task[None], http_error: str | None, dropped: str | None) -> str:
    """Why a connection task ended (the server was not being stopped)."""
    if connection.cancelled():  # the client's task group cancelled it: its transport broke
        return http_error or "the connection broke"
    exc = connection.exception()
    if exc is None:
        return dropped or http_error or "the connection closed"
    return failure(exc, http_error)


def failure(exc: BaseException, http_error: str | None = None) -> str:
    """Why connecting to or listing an MCP server failed, in words for a log line or a client: the
    ``ExceptionGroup`` the client's task groups raise unwrapped to its cause (the server is down,
    its URL is wrong, the credentials were refused, ...). ``http_error``: an HTTP error status the
    connection got, which names the cause better than the MCP error the client made of it."""
    from mcp import MCPError

    causes = _leaves(exc)
    if http_error is not None and all(isinstance(c, MCPError) for c in causes):
        return http_error
    return "; ".join(dict.fromkeys(_cause(c) for c in causes))


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        found = [leaf for sub in exc.exceptions for leaf in _leaves(sub)]
        real = [leaf for leaf in found if not isinstance(leaf, asyncio.CancelledError)]
        return real or found
    return [exc]


def _chain(exc: BaseException, kind: type[BaseException]) -> BaseException | None:
    """The first exception of ``kind`` among ``exc`` and what caused it."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, kind):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def _http_error(status: int, phrase: str, url: str) -> str:
    url = url.split("?", 1)[0]
    if status in (401, 403):
        return f"HTTP {status} {phrase}: the server refused the credentials (headers) sent"
    if status == 404:
        return f"HTTP 404 {phrase}: no MCP server at {url}"
    return f"HTTP {status} {phrase} from {url}"


def _cause(exc: BaseException) -> str:
    import httpx2

    if isinstance(exc, httpx2.HTTPStatusError):
        return _http_error(exc.response.status_code, exc.response.reason_phrase, str(exc.request.url))
    if isinstance(exc, RedirectRefused):
        return str(exc)
    if isinstance(exc, httpx2.RemoteProtocolError | httpx2.ReadError):
        return f"the server closed the connection ({exc or type(exc).__name__})"
    if isinstance(exc, httpx2.ConnectError):
        refused = _chain(exc, ConnectionRefusedError)
        why = "connection refused" if refused is not None else str(exc) or type(exc).__name__
        return f"cannot connect, the server is down or unreachable ({why})"
    if isinstance(exc, httpx2.TimeoutException):
        return f"no answer in time ({type(exc).__name__})"
    if isinstance(exc, TimeoutError):
        return "no answer within mcp_connect_timeout_s"
    if isinstance(exc, OSError) and exc.strerror:
        return f"cannot connect ({exc.strerror})"
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


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
