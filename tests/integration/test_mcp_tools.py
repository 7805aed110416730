"""The MCP client against a real MCP server built with the ``mcp`` package (tests/mcp_light_server.py),
over streamable HTTP (with a bearer token, as Home Assistant's MCP Server wants) and over stdio.

Faults are real too: "down" is a port nothing listens on, "slow" a tool that sleeps past
``mcp_call_timeout_s``, "raises" a tool that raises; each is an error result, never an exception.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from mediaserver.assistant.mcp import McpToolbox
from mediaserver.assistant.speaker_context import current_speaker
from mediaserver.config import McpServerConfig, Settings
from mediaserver.llm.tools import ToolCall
from mediaserver.metrics import Metrics
from tests.faults import eventually
from tests.ports import free_port
from tests.processes import stop_process

TOKEN = "long-lived-token"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def light_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """The light server over streamable HTTP on a loopback port: its /mcp URL and its state file."""
    state = tmp_path_factory.mktemp("lights") / "state.json"
    port = free_port()
    command = [sys.executable, "-m", "tests.mcp_light_server", "--state", str(state), "http", "--port", str(port)]
    process = subprocess.Popen([*command, "--token", TOKEN], cwd=ROOT)
    try:
        wait_listening(port, process)
        yield f"http://127.0.0.1:{port}/mcp", state
    finally:
        stop_process(process)


def start_lights(state: Path, port: int, token: str = TOKEN) -> subprocess.Popen[bytes]:
    """The light server over streamable HTTP on ``port`` (loopback), listening when this returns."""
    command = [sys.executable, "-m", "tests.mcp_light_server", "--state", str(state), "http", "--port", str(port)]
    process = subprocess.Popen([*command, "--token", token], cwd=ROOT)
    wait_listening(port, process)
    return process


def wait_listening(port: int, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while True:
        assert process.poll() is None, "the MCP server exited"
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            assert time.monotonic() < deadline, "the MCP server did not start"
            time.sleep(0.1)


def stdio_config(state: Path) -> McpServerConfig:
    return McpServerConfig(
        name="stdio-lights",
        command=sys.executable,
        args=["-m", "tests.mcp_light_server", "--state", str(state), "stdio"],
        env={"PYTHONPATH": str(ROOT)},
    )


def http_config(url: str, token: str = TOKEN) -> McpServerConfig:
    return McpServerConfig.model_validate(
        {"name": "lights", "url": url, "headers": {"Authorization": f"Bearer {token}"}}
    )


@pytest_asyncio.fixture(loop_scope="session")
async def toolbox_factory(base_settings: Settings) -> AsyncIterator[Any]:
    boxes: list[McpToolbox] = []

    async def make(*servers: McpServerConfig, **overrides: Any) -> McpToolbox:
        settings = base_settings.model_copy(update={"mcp_servers": list(servers), **overrides})
        box = McpToolbox(settings, Metrics())
        boxes.append(box)
        await box.start()
        return box

    yield make
    for box in boxes:
        await box.aclose()


def _lights(state: Path) -> dict[str, bool]:
    return json.loads(state.read_text()) if state.exists() else {}


async def test_streamable_http_with_a_token(toolbox_factory: Any, light_server: tuple[str, Path]) -> None:
    url, state = light_server
    box = await toolbox_factory(http_config(url))
    names = {tool.name for tool in box.tools()}
    assert {"set_light", "get_state"} <= names
    spec = next(t for t in box.tools() if t.name == "set_light")
    assert set(spec.parameters["properties"]) == {"name", "on"}
    assert "kitchen" in json.dumps(spec.parameters["properties"]["name"])  # the enum of lights
    result = await box.call("set_light", '{"name": "kitchen", "on": true}')
    assert not result.is_error, result
    assert "on" in result.text
    assert _lights(state)["kitchen"] is True
    state_result = await box.call("get_state", '{"name": "kitchen"}')
    assert state_result.text == "The kitchen light is on."
    samples = {
        (s.labels["tool"], s.labels["outcome"]): s.value
        for metric in box.metrics.calls.collect()
        for s in metric.samples
        if s.name.endswith("_total")
    }
    assert samples[("set_light", "ok")] == 1 and samples[("get_state", "ok")] == 1


async def test_stdio_server(toolbox_factory: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    state = tmp_path / "state.json"
    box = await toolbox_factory(stdio_config(state), mcp_check_s=0.3)
    assert {"set_light", "get_state"} <= {tool.name for tool in box.tools()}
    first = _pid_of(state)
    result = await box.call("set_light", '{"name": "bedroom", "on": false}')
    assert not result.is_error, result
    assert _lights(state) == {"bedroom": False}
    await eventually(lambda: box.checks("stdio-lights") >= 3, 30)  # checked alive, not restarted
    assert box.status()["stdio-lights"]["state"] == "up" and _pid_of(state) == first, _warnings(caplog)


async def test_a_wrong_token_leaves_the_server_without_tools(
    toolbox_factory: Any, light_server: tuple[str, Path]
) -> None:
    url, _ = light_server
    box = await toolbox_factory(http_config(url, token="wrong"), mcp_connect_timeout_s=10)
    assert box.tools() == []
    problem = box.status()["lights"]["problem"]  # the cause, not "ExceptionGroup ... (1 sub-exception)"
    assert "HTTP 401" in problem and "refused the credentials" in problem, problem
    result = await box.call("set_light", '{"name": "kitchen", "on": true}')
    assert result.is_error and "no tool" in result.text


async def test_a_server_that_is_down(toolbox_factory: Any, caplog: pytest.LogCaptureFixture) -> None:
    box = await toolbox_factory(http_config(f"http://127.0.0.1:{free_port()}/mcp"), mcp_connect_timeout_s=5)
    assert box.tools() == []
    problem = box.status()["lights"]["problem"]
    assert "down" in problem and "connection refused" in problem and "ExceptionGroup" not in problem, problem
    assert any(problem in w and "unavailable" in w for w in _warnings(caplog)), _warnings(caplog)


async def test_a_wrong_path_is_named(toolbox_factory: Any, light_server: tuple[str, Path]) -> None:
    url, _ = light_server
    box = await toolbox_factory(http_config(url.replace("/mcp", "/nothing-here")), mcp_connect_timeout_s=10)
    problem = box.status()["lights"]["problem"]
    assert problem.startswith("HTTP 404 Not Found: no MCP server at http://127.0.0.1:"), problem


async def test_slow_raising_and_bad_calls_are_error_results(
    toolbox_factory: Any, light_server: tuple[str, Path]
) -> None:
    url, _ = light_server
    box = await toolbox_factory(http_config(url), mcp_call_timeout_s=1.0, mcp_max_result_chars=100)
    slow = await box.call("slow", '{"seconds": 5}')
    assert slow.is_error and "within 1 seconds" in slow.text
    broken = await box.call("broken", "{}")
    assert broken.is_error and "broken" in broken.text  # mcp 2.x servers hide an unexpected exception's text
    assert (await box.call("set_light", "{not json")).is_error
    assert (await box.call("set_light", "[1]")).is_error
    assert (await box.call("set_light", '{"name": "garage", "on": true}')).is_error  # not in the enum
    long = await box.call("echo", json.dumps({"text": "x" * 300}))
    assert long.text == "x" * 100 + "\n[truncated: the result had 300 characters, 100 shown]"
    # The session survives all of it: the next call works.
    assert (await box.call("get_state", '{"name": "kitchen"}')).text.startswith("The kitchen light is")


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if r.name == "mediaserver.assistant.mcp" and r.levelno == logging.WARNING
    ]


async def test_a_server_that_dies_during_a_call_comes_back(
    toolbox_factory: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The server is killed while a call runs (the transport breaks under the MCP client's task
    group): the call is an error result, the server's tools are withdrawn and a WARNING says so;
    restarted on the same port, it is connected again within ``mcp_reconnect_s`` (a WARNING says it
    is back), its tools are offered again and the next call works."""
    caplog.set_level(logging.INFO, logger="mediaserver.assistant.mcp")
    state, port = tmp_path / "state.json", free_port()
    process = start_lights(state, port)
    try:
        url = f"http://127.0.0.1:{port}/mcp"
        box = await toolbox_factory(http_config(url), mcp_reconnect_s=0.5, mcp_call_timeout_s=60.0)
        assert "slow" in {t.name for t in box.tools()}
        call = asyncio.create_task(box.call("slow", '{"seconds": 600}'))
        await eventually(state.with_suffix(".slow").exists, 30)  # the server is running it
        os.kill(process.pid, signal.SIGKILL)
        await asyncio.to_thread(process.wait, 10)
        result = await asyncio.wait_for(call, 30)
        assert result.is_error, result
        print(f"the call when its server died: {result.text!r}")
        await eventually(lambda: box.tools() == [], 30)  # not offered while it is away
        await eventually(lambda: any(" went away (" in w for w in _warnings(caplog)), 30)
        assert box.status()["lights"]["problem"]

        process = start_lights(state, port)  # back, on the same port
        await eventually(lambda: "get_state" in {t.name for t in box.tools()}, 30)
        assert box.status()["lights"]["problem"] is None
        assert any(" is back: " in w for w in _warnings(caplog)), _warnings(caplog)
        await box.call("set_light", '{"name": "kitchen", "on": true}')
        again = await box.call("get_state", '{"name": "kitchen"}')
        assert not again.is_error and again.text == "The kitchen light is on.", again
        print("\n".join(_warnings(caplog)))
    finally:
        stop_process(process)


def _outcomes(box: McpToolbox) -> dict[tuple[str, str], float]:
    return {
        (s.labels["tool"], s.labels["outcome"]): s.value
        for metric in box.metrics.calls.collect()
        for s in metric.samples
        if s.name.endswith("_total")
    }


async def test_a_server_that_dies_between_calls_is_noticed_by_its_check(
    toolbox_factory: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A user trial killed the HTTP server between two turns: nothing noticed until the next user's
    call failed on it (counted an ``error``), its tools offered meanwhile. Checked every
    ``mcp_check_s``, it is withdrawn once a check fails; without checks (0) it still is not; and a call
    on a server gone is counted ``unavailable``."""
    caplog.set_level(logging.INFO, logger="mediaserver.assistant.mcp")
    state, port = tmp_path / "state.json", free_port()
    process = start_lights(state, port)
    try:
        url = f"http://127.0.0.1:{port}/mcp"
        checked = await toolbox_factory(http_config(url), mcp_check_s=0.3, mcp_reconnect_s=0.5)
        unchecked = await toolbox_factory(http_config(url), mcp_check_s=0, mcp_reconnect_s=0.5)
        assert checked.status()["lights"]["state"] == "up" and unchecked.status()["lights"]["state"] == "up"
        # Alive, it stays up through its checks (MCP's ping, which protocol 2026-07-28 removed, took a
        # live server for dead at every check).
        await eventually(lambda: checked.checks("lights") >= 3, 30)
        assert checked.status()["lights"]["state"] == "up" and not _warnings(caplog), _warnings(caplog)
        os.kill(process.pid, signal.SIGKILL)
        await asyncio.to_thread(process.wait, 10)
        await eventually(lambda: checked.tools() == [], 30)
        status = checked.status()["lights"]
        assert status["state"] == "down" and status["problem"], status  # (then: retried, refused)
        assert checked.down == ["lights"]
        assert any(" went away (" in w for w in _warnings(caplog)), _warnings(caplog)  # before any call
        # The one without pings still offers the dead server's tools: the user's call finds it down.
        assert "set_light" in {t.name for t in unchecked.tools()} and unchecked.down == []
        failed = await unchecked.call("set_light", '{"name": "kitchen", "on": true}')
        assert failed.is_error and "service is unavailable" in failed.text, failed
        assert _outcomes(unchecked).get(("set_light", "unavailable")) == 1, _outcomes(unchecked)
        await eventually(lambda: unchecked.tools() == [], 30)

        process = start_lights(state, port)
        await eventually(lambda: checked.status()["lights"]["state"] == "up", 30)
        assert not (await checked.call("get_state", '{"name": "kitchen"}')).is_error
    finally:
        stop_process(process)


async def test_health_names_each_mcp_server_and_a_down_one_degrades_it(
    server_factory: Any, light_server: tuple[str, Path]
) -> None:
    url, _ = light_server
    down = McpServerConfig.model_validate({"name": "gone", "url": f"http://127.0.0.1:{free_port()}/mcp"})
    server = await server_factory(mcp_servers=[http_config(url), down], mcp_connect_timeout_s=5)
    async with aiohttp.ClientSession() as http, http.get(f"{server.url}/health") as resp:
        assert resp.status == 200
        body = await resp.json()
    assert body["status"] == "degraded", body
    lights, gone = body["mcp"]["lights"], body["mcp"]["gone"]
    assert lights["state"] == "up" and "set_light" in lights["tools"] and lights["problem"] is None, lights
    assert gone["state"] == "down" and gone["tools"] == [] and "connection refused" in gone["problem"], gone


def _pid_of(state: Path) -> int:
    """The process whose command line names ``state``: the stdio light server mediaserver started."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if str(state).encode() in (entry / "cmdline").read_bytes():
                    return int(entry.name)
            except OSError:
                continue
    raise AssertionError(f"no process for {state}")


async def test_a_stdio_server_that_dies_during_a_call_comes_back(
    toolbox_factory: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A stdio server's process (mediaserver's child) is killed while a call runs: nothing cancels
    the client then, the call finds the connection closed; that ends the connection, the tools
    are withdrawn and a new process is started after ``mcp_reconnect_s``."""
    caplog.set_level(logging.INFO, logger="mediaserver.assistant.mcp")
    state = tmp_path / "state.json"
    box = await toolbox_factory(stdio_config(state), mcp_reconnect_s=0.5, mcp_call_timeout_s=60.0)
    call = asyncio.create_task(box.call("slow", '{"seconds": 600}'))
    await eventually(state.with_suffix(".slow").exists, 30)
    first = _pid_of(state)
    os.kill(first, signal.SIGKILL)
    result = await asyncio.wait_for(call, 30)
    assert result.is_error, result
    await eventually(lambda: any(" went away (" in w for w in _warnings(caplog)), 30)
    await eventually(lambda: any(" is back: " in w for w in _warnings(caplog)), 30)
    assert _pid_of(state) != first
    again = await box.call("echo", '{"text": "still here"}')
    assert not again.is_error and again.text == "still here", again


async def test_a_call_carries_the_speaker_of_its_turn_in_its_meta(toolbox_factory: Any, tmp_path: Path) -> None:
    """The voice loop runs each turn's tools with its speaker set (assistant/speaker_context.py):
    an MCP call carries it in the request's _meta, which the server reads."""
    config = stdio_config(tmp_path / "lights.json")
    config = config.model_copy(update={"args": [*config.args, "--whoami"]})
    box = await toolbox_factory(config)
    assert "whoami" in {tool.name for tool in box.tools()}
    assert (await box.run(ToolCall("c1", "whoami", "{}"))).text == "nobody"
    token = current_speaker.set("alice")
    try:
        result = await box.run(ToolCall("c2", "whoami", "{}"))
    finally:
        current_speaker.reset(token)
    assert result.text == "alice" and not result.is_error, result
