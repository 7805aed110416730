"""Realtime ``type: "mcp"`` tools through the SDK's ``client.realtime.connect``: the server lists a
real MCP server's tools (tests/mcp_light_server.py over streamable HTTP with a bearer token) as an
``mcp_list_tools`` item, runs the model's call itself (an ``mcp_call`` item with its output) and the
same response goes on to the answer. Faults (a tool that raises, a server down when listed or when
called) give an error the model reads, and the session stays up. Every event is validated against
the SDK's own models (``until``).

The LLM is llama-cpp-python's server on the bundled SmolLM2 (grammar-constrained calls); the
session's ``tool_choice`` is ``required`` with one allowed tool, since that model never picks a tool
by itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
import pytest_asyncio
import websockets
from aiohttp import web

from mediaserver.config import Settings
from mediaserver.metrics import Metrics
from mediaserver.transport.openai.realtime.mcp_tools import McpPolicy, SessionTools, parse_mcp_tools
from tests.conftest import LiveServer
from tests.faults import eventually, metric_samples
from tests.integration.test_mcp_tools import ROOT, TOKEN, http_config, wait_listening
from tests.integration.test_realtime_conversation import GA_EVENTS, Raw, audio_of, sdk, until
from tests.llama_upstream import llama_server, server_with_llm
from tests.ports import free_port
from tests.processes import stop_process
from tests.rtc_peer import connect_call

MODEL = "smollm2-realtime-mcp"
TEXT = {"type": "realtime", "output_modalities": ["text"]}


def start_lights(state: Path, port: int) -> tuple[subprocess.Popen[bytes], str]:
    command = [sys.executable, "-m", "tests.mcp_light_server", "--state", str(state), "http", "--port", str(port)]
    process = subprocess.Popen([*command, "--token", TOKEN], cwd=ROOT)
    wait_listening(port, process)
    return process, f"http://127.0.0.1:{port}/mcp"


@pytest.fixture(scope="module")
def lights(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    state = tmp_path_factory.mktemp("rt-lights") / "state.json"
    process, url = start_lights(state, free_port())
    try:
        yield url, state
    finally:
        stop_process(process)


@pytest.fixture(scope="module")
def spare_ports() -> tuple[int, ...]:
    """More allowed servers: one nothing listens on ("down"), one stopped after its listing, one
    paused (SIGSTOP: a server that hangs), one killed during a call and started again."""
    return free_port(), free_port(), free_port(), free_port()


@pytest.fixture(scope="module")
def mcp_upstream() -> Iterator[str]:
    with llama_server(MODEL, "--chat_format", "chatml-function-calling") as url:
        yield url


def server_settings(mcp_upstream: str, url: str, spare_ports: tuple[int, ...]) -> dict[str, Any]:
    """The settings of this module's servers: the light server at ``url`` and the spare ports allowed."""
    return {
        "llm_upstream_url": mcp_upstream,
        "assistant_temperature": 0.0,
        "assistant_max_answer_tokens": 30,
        "realtime_audio_lead_ms": 600_000,
        "realtime_mcp_allowed_urls": [url, *(f"http://127.0.0.1:{port}/mcp" for port in spare_ports)],
        # One call per response: the round after it is generated without tools (llama-cpp-python's
        # chatml-function-calling ends a stream with nothing in it for "auto" after a tool result).
        "mcp_max_calls_per_turn": 1,
        "mcp_call_timeout_s": 10.0,
        "mcp_connect_timeout_s": 10.0,
        "mcp_servers": [http_config(url).model_copy(update={"name": "home"})],  # the operator's own
    }


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def mcp_server(
    server_factory: Callable[..., Any],
    base_settings: Settings,
    mcp_upstream: str,
    lights: tuple[str, Path],
    spare_ports: tuple[int, ...],
) -> AsyncIterator[LiveServer]:
    settings = server_settings(mcp_upstream, lights[0], spare_ports)
    async with server_with_llm(server_factory, base_settings, **settings) as server:
        yield server


def mcp_tool(url: str, *allowed: str, **extra: Any) -> dict[str, Any]:
    return {
        "type": "mcp",
        "server_label": "lights",
        "server_url": url,
        "authorization": TOKEN,
        "allowed_tools": list(allowed),
        "require_approval": "never",
        **extra,
    }


async def listed(connection: Any, session: dict[str, Any]) -> tuple[Any, list[Any]]:
    """``session.update``, then the listing's events up to its ``conversation.item.done``."""
    await connection.session.update(session=session)
    events = await until(connection, "session.updated")
    events += await until(connection, "conversation.item.done", timeout=60)
    kinds = [e.type for e in events]
    assert (
        kinds.index("session.updated")
        < kinds.index("conversation.item.added")
        < kinds.index("mcp_list_tools.in_progress")
    )
    return events[-1].item, events


async def ask(connection: Any, text: str) -> list[Any]:
    await connection.conversation.item.create(
        item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    )
    await connection.response.create()
    return await until(connection, "response.done", timeout=180)


def lights_of(state: Path) -> dict[str, bool]:
    return json.loads(state.read_text()) if state.exists() else {}


async def test_an_mcp_tool_is_listed_called_and_answered(mcp_server: LiveServer, lights: tuple[str, Path]) -> None:
    url, state = lights
    async with sdk(mcp_server).realtime.connect(model="gpt-realtime") as connection:
        await until(connection, "session.created")
        tool = mcp_tool(url, "set_light")
        item, events = await listed(
            connection, {"type": "realtime", "instructions": "You control the lights.", "tools": [tool],
                         "tool_choice": "required"}
        )  # fmt: skip
        updated = next(e for e in events if e.type == "session.updated")
        echoed = updated.session.tools[0]
        assert echoed.type == "mcp" and echoed.server_label == "lights" and echoed.authorization is None
        assert "mcp_list_tools.completed" in [e.type for e in events]
        assert item.type == "mcp_list_tools" and item.server_label == "lights"
        assert [t.name for t in item.tools] == ["set_light"]  # allowed_tools
        assert set(item.tools[0].input_schema["properties"]) == {"name", "on"}

        events = await ask(connection, "Turn on the kitchen light.")
        kinds = [e.type for e in events]
        added = next(e for e in events if e.type == "response.output_item.added" and e.item.type == "mcp_call")
        call_id = added.item.id
        assert added.item.server_label == "lights" and added.item.name == "set_light"
        deltas = [e for e in events if e.type == "response.mcp_call_arguments.delta" and e.item_id == call_id]
        done = next(e for e in events if e.type == "response.mcp_call_arguments.done" and e.item_id == call_id)
        assert deltas and "".join(d.delta for d in deltas) == done.arguments
        arguments = json.loads(done.arguments)
        completed = next(e for e in events if e.type == "response.mcp_call.completed" and e.item_id == call_id)
        assert kinds.index("response.mcp_call.in_progress") < kinds.index("response.mcp_call.completed")
        assert completed.output_index == added.output_index
        item_done = next(e for e in events if e.type == "response.output_item.done" and e.item.id == call_id)
        light = arguments["name"]
        assert item_done.item.output == f"The {light} light is now {'on' if arguments['on'] else 'off'}."
        assert item_done.item.error is None and item_done.item.arguments == done.arguments
        assert lights_of(state)[light] is arguments["on"]  # the MCP server's state changed

        response = events[-1].response
        assert response.status in ("completed", "incomplete"), response  # incomplete: the token cap
        types = [o.type for o in response.output]
        assert types[0] == "message" and types[1] == "mcp_call" and types[-1] == "message", types
        answer = response.output[-1]
        transcript = answer.content[0].transcript
        assert kinds.index("response.mcp_call.completed") < kinds.index("response.done")
        # The answer after the call is a second message of the same response, spoken.
        later = [e for e in events if e.type == "response.output_audio.delta" and e.item_id == answer.id]
        assert later and audio_of(later).size > 0 and transcript.strip()
        print(f"call {done.arguments} -> {item_done.item.output!r}; answer {transcript!r}; output {types}")
        async with aiohttp.ClientSession() as http, http.get(mcp_server.url + "/metrics") as reply:
            metrics = await reply.text()
        # counted under the allowed prefix's index, not the client's label
        assert 'mediaserver_tool_calls_total{outcome="ok",server="realtime-0",tool="set_light"}' in metrics

        # The call and its output are in the conversation: a later response reads them.
        item = await connection.conversation.item.retrieve(item_id=call_id)
        retrieved = (await until(connection, "conversation.item.retrieved"))[-1].item
        assert item is None and retrieved.type == "mcp_call" and retrieved.output == item_done.item.output


async def test_a_tool_that_raises_is_an_error_the_model_reads(mcp_server: LiveServer, lights: tuple[str, Path]) -> None:
    url, _ = lights
    async with sdk(mcp_server).realtime.connect(model="gpt-realtime") as connection:
        await until(connection, "session.created")
        choice = {"type": "mcp", "server_label": "lights", "name": "broken"}  # a named MCP tool
        await listed(connection, {**TEXT, "tools": [mcp_tool(url, "broken", "echo")], "tool_choice": choice})
        events = await ask(connection, "Check the light controller.")
        failed = next(e for e in events if e.type == "response.mcp_call.failed")
        call = next(e for e in events if e.type == "response.output_item.done" and e.item.id == failed.item_id).item
        assert call.type == "mcp_call" and call.output is None
        assert call.error.type == "tool_execution_error" and "broken" in call.error.message  # as the server said it
        response = events[-1].response
        assert response.status in ("completed", "incomplete") and response.output[-1].type == "message"
        print(f"after the error the model said {response.output[-1].content[0].text!r}")
        await connection.session.update(session={**TEXT, "instructions": "still here"})
        assert (await until(connection, "session.updated"))[-1].session.instructions == "still here"


async def test_a_server_that_is_down_when_listed_or_when_called(
    server_factory: Callable[..., Any],
    base_settings: Settings,
    mcp_upstream: str,
    lights: tuple[str, Path],
    tmp_path: Path,
    spare_ports: tuple[int, ...],
) -> None:
    """A server nothing listens on fails its listing; one stopped after its listing fails the call.
    On a server of its own with ``mcp_check_s`` 0: a check (every 10 s) between the listing and the
    call finds the stopped server gone and withdraws its tools, so under load (CI, stop 67) the
    model had no tool left to call; that path is test_mcp_tools.py's (dies between calls)."""
    down, stopped = spare_ports[:2]
    settings = server_settings(mcp_upstream, lights[0], spare_ports)
    async with (
        server_with_llm(server_factory, base_settings, **settings, mcp_check_s=0) as server,
        sdk(server).realtime.connect(model="gpt-realtime") as connection,
    ):
        await until(connection, "session.created")
        nowhere = f"http://127.0.0.1:{down}/mcp"
        await connection.session.update(session={**TEXT, "tools": [mcp_tool(nowhere, "set_light")]})
        events = await until(connection, "conversation.item.done", timeout=60)
        kinds = [e.type for e in events]
        assert "mcp_list_tools.failed" in kinds and events[-1].item.tools == []
        error = next(e for e in events if e.type == "error").error
        assert "lights" in error.message and error.param == "session.tools"
        assert "connection refused" in error.message and "ExceptionGroup" not in error.message, error.message

        # A server that answered the listing and is gone when the model calls it.
        process, url = start_lights(tmp_path / "state.json", stopped)
        try:
            item, _ = await listed(
                connection, {**TEXT, "tools": [mcp_tool(url, "set_light")], "tool_choice": "required"}
            )
            assert [t.name for t in item.tools] == ["set_light"]
        finally:
            stop_process(process)
        events = await ask(connection, "Turn on the kitchen light.")
        failed = next(e for e in events if e.type == "response.mcp_call.failed")
        call = next(e for e in events if e.type == "response.output_item.done" and e.item.id == failed.item_id).item
        assert call.error is not None and call.error.message, call
        assert events[-1].response.status in ("completed", "incomplete")
        print(f"a call to a stopped server: {call.error.message!r}")
        await connection.session.update(session={**TEXT, "instructions": "still here"})
        assert (await until(connection, "session.updated"))[-1].session.instructions == "still here"


async def test_a_server_that_hangs_times_out_and_a_cancel_stops_the_call(
    mcp_server: LiveServer, tmp_path: Path, spare_ports: tuple[int, ...]
) -> None:
    process, url = start_lights(tmp_path / "state.json", spare_ports[2])
    try:
        async with sdk(mcp_server).realtime.connect(model="gpt-realtime") as connection:
            await until(connection, "session.created")
            await listed(connection, {**TEXT, "tools": [mcp_tool(url, "set_light")], "tool_choice": "required"})
            os.kill(process.pid, signal.SIGSTOP)  # the server hangs: calls get no answer
            events = await ask(connection, "Turn on the kitchen light.")
            failed = next(e for e in events if e.type == "response.mcp_call.failed")
            call = next(e for e in events if e.type == "response.output_item.done" and e.item.id == failed.item_id)
            assert "did not answer within 10 seconds" in call.item.error.message, call.item.error
            assert events[-1].response.status in ("completed", "incomplete")
            assert events[-1].response.output[-1].type == "message"

            # response.cancel while a call is running: the call is cut off, the response cancelled.
            await connection.conversation.item.create(
                item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Again."}]}
            )
            await connection.response.create()
            events = await until(connection, "response.mcp_call.in_progress", timeout=120)
            await connection.response.cancel()
            events += await until(connection, "response.done", timeout=5)  # well before the call's timeout
            response = events[-1].response
            assert response.status == "cancelled" and response.status_details.reason == "client_cancelled"
            call = next(o for o in response.output if o.type == "mcp_call")
            assert call.output is None and "cancelled" in call.error.message
            assert not [e for e in events if e.type in ("response.mcp_call.completed", "response.mcp_call.failed")]
            # The cancelled call is counted and timed (its server is the 3rd spare: prefix 3).
            cancelled = (("outcome", "cancelled"), ("server", "realtime-3"), ("tool", "set_light"))
            samples = await metric_samples(mcp_server.url)
            assert samples.get(("mediaserver_tool_calls_total", cancelled)) == 1, samples
            assert samples[("mediaserver_tool_call_seconds_count", (("server", "realtime-3"),))] >= 2
            os.kill(process.pid, signal.SIGCONT)
            await connection.session.update(session={**TEXT, "instructions": "still here"})
            assert (await until(connection, "session.updated"))[-1].session.instructions == "still here"
    finally:
        os.kill(process.pid, signal.SIGCONT)
        stop_process(process)


async def test_a_server_killed_during_a_call_is_called_again_once_it_is_back(
    mcp_server: LiveServer, tmp_path: Path, spare_ports: tuple[int, ...], caplog: pytest.LogCaptureFixture
) -> None:
    """The server is paused (SIGSTOP) so that a call is in flight, then killed: the call fails and
    the response goes on; started again on the same port, the session's connection comes back
    within ``mcp_reconnect_s`` (WARNINGs for both) and the next call runs on it."""
    caplog.set_level(logging.INFO, logger="mediaserver.assistant.mcp")
    state, port = tmp_path / "state.json", spare_ports[3]
    process, url = start_lights(state, port)
    try:
        async with sdk(mcp_server).realtime.connect(model="gpt-realtime") as connection:
            await until(connection, "session.created")
            await listed(connection, {**TEXT, "tools": [mcp_tool(url, "set_light")], "tool_choice": "required"})
            os.kill(process.pid, signal.SIGSTOP)
            await connection.conversation.item.create(
                item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Kitchen on."}]}
            )
            await connection.response.create()
            events = await until(connection, "response.mcp_call.in_progress", timeout=120)
            os.kill(process.pid, signal.SIGKILL)  # it dies with the call in flight
            await asyncio.to_thread(process.wait, 10)
            events += await until(connection, "response.done", timeout=60)
            assert "response.mcp_call.failed" in [e.type for e in events]

            def warned(words: str) -> bool:
                return any(
                    r.levelno == logging.WARNING and "realtime-4" in r.getMessage() and words in r.getMessage()
                    for r in caplog.records
                )

            await eventually(lambda: warned(" went away ("), 30)
            process, _ = start_lights(state, port)
            await eventually(lambda: warned(" is back: "), 60)
            events = await ask(connection, "Turn on the kitchen light.")
            completed = [e for e in events if e.type == "response.mcp_call.completed"]
            assert completed, [e.type for e in events]
            item = next(e.item for e in events if e.type == "response.output_item.done" and e.item.type == "mcp_call")
            arguments = json.loads(item.arguments)
            assert lights_of(state)[arguments["name"]] is arguments["on"], item
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGCONT)
        stop_process(process)


async def test_refused_mcp_tools_are_errors_and_change_nothing(
    mcp_server: LiveServer, lights: tuple[str, Path]
) -> None:
    url, _ = lights
    async with sdk(mcp_server).realtime.connect(model="gpt-realtime") as connection:
        await until(connection, "session.created")
        cases = [
            (mcp_tool("http://169.254.169.254/latest/mcp", "set_light"), "session.tools[0].server_url",
             "realtime_mcp_allowed_urls"),
            (mcp_tool(url, "set_light", require_approval="always"), "session.tools[0].require_approval", "never"),
            ({k: v for k, v in mcp_tool(url).items() if k != "require_approval"},
             "session.tools[0].require_approval", "never"),
            ({"type": "mcp", "server_label": "garage", "require_approval": "never"}, "session.tools[0].server_url",
             "home"),
        ]  # fmt: skip
        for tool, param, words in cases:
            await connection.session.update(session={**TEXT, "tools": [tool]})
            error = (await until(connection, "error"))[-1].error
            assert error.param == param and words in error.message, error
        await connection.session.update(
            session={**TEXT, "tools": [mcp_tool(url)], "tool_choice": {"type": "mcp", "server_label": "other"}}
        )
        assert (await until(connection, "error"))[-1].error.param == "session.tool_choice"
        await connection.session.update(session={**TEXT, "instructions": "still here"})
        updated = (await until(connection, "session.updated"))[-1].session
        assert updated.instructions == "still here" and updated.tools == []


async def test_the_operators_server_by_label(mcp_server: LiveServer) -> None:
    """``mcp_servers`` has "home" (the light server with its token): a client names it, no URL."""
    async with sdk(mcp_server).realtime.connect(model="gpt-realtime") as connection:
        await until(connection, "session.created")
        tool = {"type": "mcp", "server_label": "home", "require_approval": "never", "allowed_tools": ["get_state"]}
        item, _ = await listed(connection, {**TEXT, "tools": [tool]})
        assert item.server_label == "home" and [t.name for t in item.tools] == ["get_state"]


async def test_beta_sessions_have_no_mcp_tools(mcp_server: LiveServer, lights: tuple[str, Path]) -> None:
    """The SDK's beta models have no MCP events: a beta session is told to use the GA interface."""
    url, _ = lights
    endpoint = mcp_server.url.replace("http", "ws") + "/v1/realtime?model=gpt-4o-realtime-preview"
    async with websockets.connect(endpoint, additional_headers={"OpenAI-Beta": "realtime=v1"}) as socket:
        connection = Raw(socket, beta=True)
        await connection.until("session.created")
        await connection.send({"type": "session.update", "session": {"tools": [mcp_tool(url, "set_light")]}})
        error = (await connection.until("error"))[-1]["error"]
        assert error["param"] == "session.tools" and "GA" in error["message"]
        await connection.send({"type": "session.update", "session": {"instructions": "still here"}})
        assert (await connection.until("session.updated"))[-1]["session"]["tools"] == []
    # Nor through a beta minting endpoint: a 400 at minting, as session.update refuses them.
    async with aiohttp.ClientSession() as http:
        body = {"model": "gpt-4o-realtime-preview", "tools": [mcp_tool(url, "set_light")]}
        async with http.post(f"{mcp_server.url}/v1/realtime/sessions", json=body) as resp:
            answer = await resp.json()
    assert resp.status == 400 and "GA" in answer["error"]["message"], answer


async def test_a_client_secret_session_lists_its_servers_at_once(
    mcp_server: LiveServer, lights: tuple[str, Path]
) -> None:
    """A session configured before it opens (a client secret's) connects its MCP servers after
    ``session.created``; an MCP tool the operator does not allow is a 400 at minting."""
    url, _ = lights
    client = sdk(mcp_server)
    secret = await client.realtime.client_secrets.create(session={**TEXT, "tools": [mcp_tool(url, "get_state")]})
    async with sdk_with_key(mcp_server, secret.value).realtime.connect(model="gpt-realtime") as connection:
        events = await until(connection, "conversation.item.done", timeout=60)
        kinds = [e.type for e in events]
        assert kinds[0] == "session.created" and "mcp_list_tools.completed" in kinds
        assert [t.name for t in events[-1].item.tools] == ["get_state"]
        assert events[0].session.tools[0].headers is None and events[0].session.tools[0].authorization is None
    with pytest.raises(openai.BadRequestError) as refused:
        await client.realtime.client_secrets.create(session={**TEXT, "tools": [mcp_tool("http://10.1.2.3/mcp")]})
    assert "realtime_mcp_allowed_urls" in str(refused.value)


def sdk_with_key(server: LiveServer, key: str) -> Any:
    return openai.AsyncOpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0)


async def test_a_webrtc_call_with_an_mcp_tool(mcp_server: LiveServer, lights: tuple[str, Path]) -> None:
    """``POST /v1/realtime/calls`` with the tool in its session: the listing and the call's events on
    the ``oai-events`` data channel, validated like the socket's."""
    url, state = lights
    session = {**TEXT, "tools": [mcp_tool(url, "set_light")], "tool_choice": "required"}
    peer, _ = await connect_call(mcp_server, session)
    try:
        events = await call_events(peer, "conversation.item.done")
        assert events[0]["type"] == "session.created" and "mcp_list_tools.completed" in [e["type"] for e in events]
        assert [t["name"] for t in events[-1]["item"]["tools"]] == ["set_light"]
        user = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Bedroom light off."}]}
        peer.channel.send(json.dumps({"type": "conversation.item.create", "item": user}))
        peer.channel.send(json.dumps({"type": "response.create"}))
        events = await call_events(peer, "response.done", timeout=180)
        call = next(
            e["item"] for e in events if e["type"] == "response.output_item.done" and e["item"]["type"] == "mcp_call"
        )
        arguments = json.loads(call["arguments"])
        assert call["output"].startswith(f"The {arguments['name']} light is now")
        assert lights_of(state)[arguments["name"]] is arguments["on"]
        assert events[-1]["response"]["status"] in ("completed", "incomplete")
    finally:
        await peer.close()


async def call_events(peer: Any, kind: str, timeout: float = 60.0) -> list[dict[str, Any]]:
    got: list[dict[str, Any]] = []
    async with asyncio.timeout(timeout):
        while True:
            event = await peer.next(timeout=timeout)
            GA_EVENTS.validate_python(event)
            got.append(event)
            if event["type"] == kind:
                return got


async def test_a_redirect_stays_under_the_allowed_prefix(base_settings: Settings) -> None:
    """A real HTTP server on loopback answers a client's MCP URL with ``307 Location: /admin``: the
    same origin, outside the allowed prefix ``/mcp``. It is not followed (``/admin`` never gets a
    request) and the listing's problem names the redirect; a redirect under the prefix is followed."""
    hits: dict[str, int] = {}

    async def handler(request: web.Request) -> web.StreamResponse:
        hits[request.path] = hits.get(request.path, 0) + 1
        if request.path == "/mcp/out":
            raise web.HTTPTemporaryRedirect("/admin")
        if request.path == "/mcp/in":
            raise web.HTTPTemporaryRedirect("/mcp/deeper")
        return web.Response(status=404 if request.path == "/mcp/deeper" else 200, text="admin")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    tools = None
    try:
        base = f"http://127.0.0.1:{port}"
        policy = McpPolicy(allowed_urls=(f"{base}/mcp",))
        declared = parse_mcp_tools(
            [mcp_tool(f"{base}/mcp/out"), {**mcp_tool(f"{base}/mcp/in"), "server_label": "inside"}], policy
        )
        tools = SessionTools(declared, base_settings.model_copy(update={"mcp_connect_timeout_s": 10.0}), Metrics())
        await tools.start()
        listed_out, problem = tools.listing("lights")
        assert listed_out == [] and problem is not None
        assert f"redirect to {base}/admin" in problem and "not followed" in problem, problem
        assert hits.get("/admin", 0) == 0 and hits["/mcp/out"] >= 1, hits
        _, inside = tools.listing("inside")
        assert hits.get("/mcp/deeper", 0) >= 1 and inside is not None and "404" in inside, (hits, inside)
    finally:
        if tools is not None:
            await tools.aclose()
        await runner.cleanup()
