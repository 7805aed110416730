"""A Realtime session's ``type: "mcp"`` tools: MCP servers the session declares, called by this server.

A session tool ``{"type": "mcp", "server_label", "server_url", "headers", "authorization",
"allowed_tools", "require_approval": "never"}`` is parsed here (``parse_mcp_tool``, a pure function)
into an ``McpTool``; the session's ``SessionTools`` connects to its servers with the voice loop's
MCP client (``assistant/mcp.py``: streamable HTTP, the call timeout, result size cap, metrics), lists
their tools and runs the calls the model makes.

What a client may reach is the operator's choice, since a client telling the server where to connect
is a request forgery risk: a ``server_url`` must start with one of ``realtime_mcp_allowed_urls``
(scheme, host and port equal, the path under the prefix's; none by default; a redirect out of the
prefix is not followed), and a tool without
``server_url`` whose ``server_label`` names one of the operator's ``mcp_servers`` uses that server as
configured (``realtime_mcp_operator_servers``; the client's headers are not sent to it).
``require_approval`` other than ``"never"`` is refused: the approval flow (``mcp_approval_request`` /
``mcp_approval_response``) is not implemented. ``connector_id`` and ``tunnel_id`` are OpenAI's
services and refused too.
"""

from __future__ import annotations

import functools
import re
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from pydantic import SecretStr

from mediaserver.assistant.mcp import McpToolbox, ToolResult
from mediaserver.config import McpServerConfig, Settings
from mediaserver.llm.tools import ToolSpec
from mediaserver.metrics import Metrics
from mediaserver.transport.openai.realtime.values import EventError, type_name

LABEL: Final = re.compile(r"^[A-Za-z0-9_-]{1,32}$")  # an MCP server name in settings, logs and metrics
REDACTED: Final = "<redacted>"


@dataclass(frozen=True)
class McpPolicy:
    """What the operator lets Realtime clients reach (from the settings)."""

    allowed_urls: tuple[str, ...] = ()
    operator: Mapping[str, McpServerConfig] | None = None  # by name; None: not offered
    max_servers: int = 4

    @classmethod
    def of(cls, settings: Settings) -> McpPolicy:
        operator = {s.name: s for s in settings.mcp_servers} if settings.realtime_mcp_operator_servers else None
        return cls(tuple(settings.realtime_mcp_allowed_urls), operator, settings.realtime_mcp_max_servers)


@dataclass(frozen=True)
class McpTool:
    """One declared MCP server: where it is and which of its tools the model may call."""

    label: str
    server: McpServerConfig  # how to reach it (the client's URL and headers, or the operator's server)
    allowed: tuple[str, ...] | None = None  # None: all its tools
    # Its name in logs and metrics: the operator's server's name, or ``realtime-<i>`` for a URL under
    # the i-th allowed prefix (a client's labels would be metric labels without bound).
    metrics_name: str = "realtime"
    # The allowed prefix the client's URL is under: its requests, redirects included, stay under it.
    # None: the operator's server.
    prefix: str | None = None

    def key(self) -> tuple[Any, ...]:
        """Equal for two declarations of the same connection (a session.update repeating it keeps it)."""
        headers = tuple(sorted((k, v.get_secret_value()) for k, v in self.server.headers.items()))
        return (self.label, self.server.url, self.server.command, tuple(self.server.args), headers, self.allowed)


def is_mcp(tool: object) -> bool:
    return isinstance(tool, dict) and tool.get("type") == "mcp"


def url_allowed(url: str, prefixes: Sequence[str]) -> bool:
    """``url`` is under one of ``prefixes``: same scheme, host and port, and its path below theirs."""
    return matching_prefix(url, prefixes) is not None


def matching_prefix(url: str, prefixes: Sequence[str]) -> int | None:
    """The index of the first of ``prefixes`` that ``url`` is under (``url_allowed``), or None."""
    try:
        target = urllib.parse.urlsplit(url)
        target_port = target.port
    except ValueError:
        return None
    if target.scheme not in ("http", "https") or not target.hostname or target.username or target.password:
        return None
    path = target.path or "/"
    if "/../" in path + "/" or "/./" in path + "/" or _ODD_PATH.search(path):
        return None
    for index, prefix in enumerate(prefixes):
        try:
            allowed = urllib.parse.urlsplit(prefix.strip())
            allowed_port = allowed.port
        except ValueError:
            continue
        if (allowed.scheme, allowed.hostname, allowed_port) != (target.scheme, target.hostname, target_port):
            continue
        base = allowed.path or "/"
        if path == base or path.startswith(base if base.endswith("/") else base + "/"):
            return index
    return None


# Encoded dots, slashes and backslashes, backslashes and ';' path parameters: what a server or a
# proxy may turn into a path outside the allowed prefix ("/mcp/%2e%2e/admin", "/mcp/..;/admin").
_ODD_PATH = re.compile(r"%2e|%2f|%5c|\\|;", re.IGNORECASE)
# Headers a client may not set on the server's requests: they would choose another virtual host
# behind the allowed address, or break the request's framing.
_FORBIDDEN_HEADERS = frozenset(
    {
        "host", "content-length", "transfer-encoding", "connection", "keep-alive", "upgrade", "te", "trailer",
        "proxy-authorization", "proxy-connection", "cookie", "forwarded", "x-forwarded-for", "x-forwarded-host",
        "x-forwarded-proto",
    }
)  # fmt: skip


def _strings(value: object, param: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise EventError("invalid_type", f"Invalid type for '{param}': expected an array of tool names.", param)
    return tuple(value)


def _allowed_tools(value: object, param: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, dict):
        if value.get("read_only") is not None:
            raise EventError(
                "invalid_value",
                f"Invalid '{param}.read_only': filtering MCP tools by read_only is not supported here; "
                "list them in tool_names.",
                f"{param}.read_only",
            )
        names = value.get("tool_names")
        return None if names is None else _strings(names, f"{param}.tool_names")
    return _strings(value, param)


def _headers(spec: Mapping[str, Any], param: str) -> dict[str, SecretStr]:
    raw = spec.get("headers")
    headers: dict[str, SecretStr] = {}
    if raw is not None:
        if not isinstance(raw, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in raw.items()):
            raise EventError(
                "invalid_type",
                f"Invalid type for '{param}.headers': expected an object of strings.",
                f"{param}.headers",
            )
        refused = sorted(k for k in raw if k.strip().lower() in _FORBIDDEN_HEADERS)
        if refused:
            raise EventError(
                "invalid_value",
                f"Invalid '{param}.headers': {', '.join(refused)} cannot be set by a client.",
                f"{param}.headers",
            )
        headers = {k: SecretStr(v) for k, v in raw.items()}
    authorization = spec.get("authorization")
    if authorization is not None:
        if not isinstance(authorization, str):
            raise EventError(
                "invalid_type",
                f"Invalid type for '{param}.authorization': expected a string.",
                f"{param}.authorization",
            )
        headers["Authorization"] = SecretStr(f"Bearer {authorization}")
    return headers


def parse_mcp_tool(spec: Mapping[str, Any], param: str, policy: McpPolicy | None) -> McpTool:
    """One ``type: "mcp"`` session tool, checked against what the operator allows."""
    label = spec.get("server_label")
    if not isinstance(label, str) or not LABEL.match(label):
        raise EventError(
            "invalid_value",
            f"Invalid '{param}.server_label': {label!r}; expected 1-32 letters, digits, underscores or dashes.",
            f"{param}.server_label",
        )
    approval = spec.get("require_approval")
    if approval != "never":
        raise EventError(
            "invalid_value",
            f"Invalid '{param}.require_approval': {approval!r}. This server runs MCP tools without asking: set "
            "require_approval to 'never' (approval requests are not supported).",
            f"{param}.require_approval",
        )
    for key in ("connector_id", "tunnel_id"):
        if spec.get(key) is not None:
            raise EventError(
                "invalid_value",
                f"Invalid '{param}.{key}': OpenAI's connectors and tunnels are not available here; give "
                "server_url, or the server_label of one of the server's configured MCP servers.",
                f"{param}.{key}",
            )
    allowed = _allowed_tools(spec.get("allowed_tools"), f"{param}.allowed_tools")
    url = spec.get("server_url")
    policy = policy or McpPolicy()
    if url is None:
        operator = (policy.operator or {}).get(label)
        if operator is None:
            offered = ", ".join(policy.operator or ()) or "none"
            raise EventError(
                "invalid_value",
                f"Invalid '{param}': give server_url, or a server_label naming one of this server's MCP servers "
                f"(mcp_servers with realtime_mcp_operator_servers on: {offered}).",
                f"{param}.server_url",
            )
        if allowed is not None and operator.allowed_tools is not None:
            allowed = tuple(name for name in allowed if name in operator.allowed_tools)
        elif allowed is None and operator.allowed_tools is not None:
            allowed = tuple(operator.allowed_tools)
        return McpTool(label, operator, allowed, operator.name)
    if not isinstance(url, str):
        raise EventError(
            "invalid_type",
            f"Invalid type for '{param}.server_url': expected a string, but got {type_name(url)}.",
            f"{param}.server_url",
        )
    matched = matching_prefix(url, policy.allowed_urls)
    if matched is None:
        raise EventError(
            "invalid_value",
            f"Invalid '{param}.server_url': {url!r} is not an MCP server this server may connect to for a client; "
            "the operator allows URLs by prefix in realtime_mcp_allowed_urls (MEDIASERVER_REALTIME_MCP_ALLOWED_URLS).",
            f"{param}.server_url",
        )
    server = McpServerConfig(name=label, url=url, headers=_headers(spec, param))
    return McpTool(label, server, allowed, f"realtime-{matched}", policy.allowed_urls[matched])


def parse_mcp_tools(tools: Sequence[Any], policy: McpPolicy | None) -> tuple[McpTool, ...]:
    parsed: list[McpTool] = []
    for index, tool in enumerate(tools):
        if is_mcp(tool):
            mcp = parse_mcp_tool(tool, f"session.tools[{index}]", policy)
            if any(p.label == mcp.label for p in parsed):
                raise EventError(
                    "invalid_value",
                    f"Invalid 'session.tools[{index}].server_label': {mcp.label!r} is used twice.",
                    "session.tools",
                )
            parsed.append(mcp)
            limit = policy.max_servers if policy is not None else 0
            if len(parsed) > limit:
                raise EventError(
                    "invalid_value",
                    f"Invalid 'session.tools[{index}]': a session has at most {limit} tools of type 'mcp' "
                    "(realtime_mcp_max_servers).",
                    "session.tools",
                )
    return tuple(parsed)


def redacted(tool: Any) -> Any:
    """A session tool as ``session.updated`` echoes it: no credentials."""
    if not is_mcp(tool):
        return tool
    echoed = {k: v for k, v in tool.items() if k != "authorization"}
    if isinstance(echoed.get("headers"), dict):
        echoed["headers"] = dict.fromkeys(echoed["headers"], REDACTED)
    return echoed


def list_tools_item(item_id: str, label: str, tools: Sequence[ToolSpec]) -> dict[str, Any]:
    return {
        "id": item_id,
        "object": "realtime.item",
        "type": "mcp_list_tools",
        "server_label": label,
        "tools": [
            {"name": t.name, "description": t.description, "input_schema": dict(t.parameters), "annotations": None}
            for t in tools
        ],
    }


class SessionTools:
    """The MCP servers one session declared: connected, listed and called through an ``McpToolbox``."""

    def __init__(self, declared: Sequence[McpTool], settings: Settings, metrics: Metrics) -> None:
        self.declared = tuple(declared)
        self._labels: dict[str, str] = {}  # the toolbox's server name -> the session's server_label
        servers: list[McpServerConfig] = []
        guards: dict[str, Callable[[str], bool]] = {}
        for mcp in self.declared:
            name, repeat = mcp.metrics_name, 1
            while name in self._labels:
                repeat += 1
                name = f"{mcp.metrics_name}-{repeat}"
            self._labels[name] = mcp.label
            update: dict[str, Any] = {"name": name}
            if mcp.allowed is not None:
                update["allowed_tools"] = list(mcp.allowed)
            servers.append(mcp.server.model_copy(update=update))
            if mcp.prefix is not None:
                guards[name] = functools.partial(url_allowed, prefixes=(mcp.prefix,))
        self.toolbox = McpToolbox(settings.model_copy(update={"mcp_servers": servers}), metrics, url_allowed=guards)

    def _name_of(self, label: str) -> str | None:
        return next((name for name, known in self._labels.items() if known == label), None)

    async def start(self) -> None:
        await self.toolbox.start()

    def listing(self, label: str) -> tuple[list[ToolSpec], str | None]:
        name = self._name_of(label)
        return self.toolbox.server_tools(name) if name is not None else ([], "not declared")

    def tools(self) -> list[ToolSpec]:
        return self.toolbox.tools()

    def owns(self, name: str) -> bool:
        return self.toolbox.locate(name) is not None

    def locate(self, name: str) -> tuple[str, str] | None:
        """An exposed tool name -> (the server_label, the server's own tool name)."""
        found = self.toolbox.locate(name)
        return (self._labels.get(found[0], found[0]), found[1]) if found is not None else None

    def exposed(self, label: object, name: object) -> str | None:
        server = self._name_of(label) if isinstance(label, str) else None
        if server is None or not isinstance(name, str):
            return None
        return self.toolbox.exposed(server, name)

    async def call(self, name: str, arguments: str, *, refuse: str | None = None) -> ToolResult:
        return await self.toolbox.call(name, arguments, refuse=refuse)

    async def aclose(self) -> None:
        await self.toolbox.aclose()
