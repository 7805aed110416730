"""Realtime ``type: "mcp"`` session tools, parsed directly: what the operator allows a client to
reach (URL prefixes, the operator's own servers by label), approval, allowed tools, and the echo
without credentials."""

from __future__ import annotations

from typing import Any

import pytest
from openai.types.realtime import ConversationItem
from pydantic import TypeAdapter

from mediaserver.config import McpServerConfig
from mediaserver.transport.openai.realtime.items import Item, Items
from mediaserver.transport.openai.realtime.mcp_tools import (
    REDACTED,
    McpPolicy,
    parse_mcp_tool,
    parse_mcp_tools,
    redacted,
    url_allowed,
)
from mediaserver.transport.openai.realtime.values import EventError

ALLOWED = ("http://127.0.0.1:8123/mcp", "https://tools.example.com/")
HOME = McpServerConfig(name="home", url="http://ha.local:8123/api/mcp", headers={"Authorization": "Bearer t"},
                       allowed_tools=["HassTurnOn", "HassTurnOff"])  # fmt: skip
POLICY = McpPolicy(ALLOWED, {"home": HOME})


def tool(**fields: Any) -> dict[str, Any]:
    return {"type": "mcp", "server_label": "lights", "require_approval": "never", **fields}


@pytest.mark.parametrize(
    ("url", "allowed"),
    [
        ("http://127.0.0.1:8123/mcp", True),
        ("http://127.0.0.1:8123/mcp/", True),
        ("http://127.0.0.1:8123/mcp/sub", True),
        ("http://127.0.0.1:8123/mcpx", False),  # not under the prefix's path
        ("http://127.0.0.1:8124/mcp", False),  # another port
        ("https://127.0.0.1:8123/mcp", False),  # another scheme
        ("http://127.0.0.1.evil.com:8123/mcp", False),
        ("http://user@127.0.0.1:8123/mcp", False),  # credentials in the URL
        ("http://127.0.0.1:8123/mcp/../admin", False),
        ("http://127.0.0.1:8123/mcp/%2e%2e/admin", False),  # dots a proxy would decode
        ("http://127.0.0.1:8123/mcp/.%2E/admin", False),
        ("http://127.0.0.1:8123/mcp/%2e%2e%2fadmin", False),
        ("http://127.0.0.1:8123/mcp/..;/admin", False),  # a path parameter some servers strip
        ("http://127.0.0.1:8123/mcp/a%5c..%5cadmin", False),
        ("https://tools.example.com/anything", True),
        ("https://tools.example.com:443/x", False),  # an explicit port is another origin spelling: refused
        ("file:///etc/passwd", False),
        ("http://[::1", False),
    ],
)
def test_urls_are_allowed_by_prefix(url: str, allowed: bool) -> None:
    assert url_allowed(url, ALLOWED) is allowed


def test_a_client_server_with_headers_and_a_token() -> None:
    parsed = parse_mcp_tool(
        tool(server_url="http://127.0.0.1:8123/mcp", headers={"X-Key": "k"}, authorization="tok",
             allowed_tools={"tool_names": ["set_light"]}),
        "session.tools[0]",
        POLICY,
    )  # fmt: skip
    assert parsed.label == "lights" and parsed.server.url == "http://127.0.0.1:8123/mcp"
    headers = {k: v.get_secret_value() for k, v in parsed.server.headers.items()}
    assert headers == {"X-Key": "k", "Authorization": "Bearer tok"}
    assert parsed.allowed == ("set_light",)
    assert parsed.metrics_name == "realtime-0"  # the client's label is not a metric label
    other = parse_mcp_tool(tool(server_url="https://tools.example.com/x"), "session.tools[0]", POLICY)
    assert other.metrics_name == "realtime-1" and other.allowed is None


def test_the_operator_server_by_label_keeps_its_own_connection_and_limits() -> None:
    parsed = parse_mcp_tool(
        {"type": "mcp", "server_label": "home", "require_approval": "never", "allowed_tools": ["HassTurnOn", "Nuke"]},
        "session.tools[0]",
        POLICY,
    )
    assert parsed.server is HOME and parsed.allowed == ("HassTurnOn",)  # never more than the operator allows
    assert parsed.metrics_name == "home"
    error = _error(tool(server_label="home"), McpPolicy(ALLOWED, None))  # realtime_mcp_operator_servers off
    assert error.param == "session.tools[0].server_url"


def _error(spec: dict[str, Any], policy: McpPolicy | None = POLICY) -> EventError:
    with pytest.raises(EventError) as caught:
        parse_mcp_tool(spec, "session.tools[0]", policy)
    return caught.value


@pytest.mark.parametrize(
    ("spec", "param", "words"),
    [
        (tool(server_url="http://10.0.0.1/mcp"), "session.tools[0].server_url", "realtime_mcp_allowed_urls"),
        (tool(require_approval="always", server_url=ALLOWED[0]), "session.tools[0].require_approval", "never"),
        ({**tool(server_url=ALLOWED[0]), "require_approval": None}, "session.tools[0].require_approval", "never"),
        (tool(require_approval={"never": {"tool_names": ["x"]}}), "session.tools[0].require_approval", "never"),
        (tool(server_label="bad label!"), "session.tools[0].server_label", "letters"),
        (tool(connector_id="connector_gmail"), "session.tools[0].connector_id", "connectors"),
        (tool(server_label="nowhere"), "session.tools[0].server_url", "home"),
        (tool(server_url=5), "session.tools[0].server_url", "string"),
        (tool(server_url=ALLOWED[0], headers={"a": 1}), "session.tools[0].headers", "strings"),
        (tool(server_url=ALLOWED[0], headers={"Host": "admin.internal"}), "session.tools[0].headers", "Host"),
        (tool(server_url=ALLOWED[0], headers={"transfer-encoding": "chunked"}), "session.tools[0].headers", "cannot"),
        (
            tool(server_url=ALLOWED[0], allowed_tools={"read_only": True}),
            "session.tools[0].allowed_tools.read_only",
            "read_only",
        ),
        (tool(server_url=ALLOWED[0], allowed_tools="all"), "session.tools[0].allowed_tools", "array"),
    ],
)
def test_bad_mcp_tools(spec: dict[str, Any], param: str, words: str) -> None:
    error = _error(spec)
    assert error.param == param and words in error.message, error.message


def test_labels_are_unique_and_the_echo_has_no_credentials() -> None:
    one = tool(server_url=ALLOWED[0], authorization="secret", headers={"X-Key": "k"})
    with pytest.raises(EventError) as caught:
        parse_mcp_tools([one, {"type": "function", "name": "f"}, dict(one)], POLICY)
    assert "twice" in caught.value.message
    echoed = redacted(one)
    assert "authorization" not in echoed and echoed["headers"] == {"X-Key": REDACTED}
    assert one["authorization"] == "secret"  # the session's own copy is untouched


def test_a_session_has_at_most_max_servers() -> None:
    servers = [tool(server_label=f"s{i}", server_url=ALLOWED[0]) for i in range(3)]
    assert len(parse_mcp_tools(servers, McpPolicy(ALLOWED, None, max_servers=3))) == 3
    with pytest.raises(EventError) as caught:
        parse_mcp_tools(servers, McpPolicy(ALLOWED, None, max_servers=2))
    assert "realtime_mcp_max_servers" in caught.value.message and caught.value.param == "session.tools"


def test_mcp_items_in_the_context_and_their_shape() -> None:
    """An ``mcp_call`` is the model's call and its result for later responses (an error as an error
    result); an ``mcp_list_tools`` item is left out. Both are the SDK's item shapes."""
    items = Items(10)
    items.add(Item("item_1", "user", "input_text", "Turn on the kitchen light."))
    ok = Item("item_2", "assistant", "output_text", '{"name": "kitchen", "on": true}', type="mcp_call")
    ok.call_id, ok.name, ok.server_label, ok.output = "call_1", "set_light", "lights", "The kitchen light is now on."
    failed = Item("item_3", "assistant", "output_text", "{}", type="mcp_call", call_id="call_2", name="broken")
    failed.server_label, failed.error = "lights", {"type": "tool_execution_error", "message": "on fire"}
    listing = Item("item_4", "assistant", "output_text", "", type="mcp_list_tools", server_label="lights", tools=[])
    for item in (ok, failed, listing):
        items.add(item)
    context = items.context()
    assert [(m.role, m.content) for m in context] == [
        ("user", "Turn on the kitchen light."),
        ("assistant", ""),
        ("tool", "The kitchen light is now on."),
        ("assistant", ""),
        ("tool", "Error: on fire"),
    ]
    assert context[1].tool_calls[0].name == "set_light" and context[2].tool_call_id == "call_1"
    assert items.pending() == []  # a listing is not an input waiting for its transcript
    adapter: TypeAdapter[Any] = TypeAdapter(ConversationItem)
    for item in (ok, failed, listing):
        adapter.validate_python(item.describe(beta=False))
