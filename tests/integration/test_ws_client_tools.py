"""Client-side tools on the device WebSocket (``/api/ws/asr`` with ``assistant: true``): the device
declares a function in ``start``, says "Make the lamp red." (Piper, streamed as PCM), gets the
model's call (``assistant_tool_call`` with ``"client": true``), answers it (``tool_output``), and
the answer follows.

The LLM is the bundled SmolLM2-135M on the server's own llama-server engine, which never chooses a
tool by itself, so the device forces one (``tool_choice`` ``required`` or named): that engine
constrains the call to a valid one (mediaserver.llm.forced_calls). Answers are text only
(``speak: false``): the spoken path is the same as for MCP tools (test_voice_tools.py).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from mediaserver.config import McpServerConfig
from mediaserver.state import SESSIONS
from tests.conftest import Clip, LiveServer
from tests.faults import abort_ws, metrics_text, session_tasks
from tests.integration.test_realtime_prompt_fit import big_result
from tests.integration.test_voice_loop import WsClient

ROOT = Path(__file__).resolve().parents[2]
COLORS = ["red", "green", "blue", "yellow", "white", "black"]
SET_LAMP_COLOR = {
    "type": "function",
    "name": "set_lamp_color",
    "description": "Change the colour of the lamp.",
    "parameters": {
        "type": "object",
        "properties": {"color": {"type": "string", "enum": COLORS, "description": "the new colour"}},
        "required": ["color"],
    },
}
SETTINGS: dict[str, Any] = {
    "assistant_temperature": 0.0,
    # Room for the bundled model's forced call (31-37 tokens for a colour on the embedded engine):
    # a cap that cuts it leaves the call not run (tool_rounds.py), as 30 did test_browser_page_tool.py's in CI.
    "assistant_max_answer_tokens": 60,
    "assistant_system_prompt": "You are a voice assistant that controls a lamp.",
    "mcp_max_calls_per_turn": 1,
}


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def tools_server(server_factory: Callable[..., Any]) -> LiveServer:
    server: LiveServer = await server_factory(assistant_client_tool_timeout_s=2.0, **SETTINGS)
    return server


@asynccontextmanager
async def _device(server: LiveServer) -> AsyncIterator[WsClient]:
    async with aiohttp.ClientSession() as http, http.ws_connect(f"{server.url}/api/ws/asr") as ws:
        yield WsClient(ws)


async def _send(client: WsClient, kind: str, **fields: Any) -> None:
    await client.ws.send_str(json.dumps({"type": kind, **fields}))


async def _start(client: WsClient, **extra: Any) -> dict[str, Any]:
    values = {"assistant": True, "speak": False, "tools": [SET_LAMP_COLOR], "tool_choice": "required", **extra}
    await _send(client, "start", **values)
    got = await client.until("ready", "error", timeout=10)
    assert got[-1]["type"] == "ready", got
    return got[-1]


def _answer(messages: list[dict[str, Any]]) -> str:
    return str(next(m["text"] for m in messages if m["type"] == "assistant" and m["final"]))


async def _final_answer(client: WsClient, timeout: float = 90.0) -> list[dict[str, Any]]:
    """Messages up to the answer's final text, or up to an error (a failed turn has no final)."""
    deadline = time.monotonic() + timeout
    got: list[dict[str, Any]] = []
    while not any((m["type"] == "assistant" and m["final"]) or m["type"] == "error" for m in got):
        got += await client.until("assistant", "error", timeout=max(0.05, deadline - time.monotonic()))
    return got


async def test_the_device_runs_its_tool_and_the_answer_follows(
    tools_server: LiveServer, speech: Callable[[str], Clip]
) -> None:
    async with _device(tools_server) as client:
        ready = await _start(client)
        assert ready["assistant"] is True and ready["tools"] == ["set_lamp_color"], ready
        await client.speak(speech("Make the lamp red."))
        got = await client.until("assistant_tool_call", timeout=90)
        call = got[-1]
        assert call["client"] is True and call["name"] == "set_lamp_color", call
        arguments = json.loads(call["arguments"])
        print(f"heard {[m['text'] for m in got if m['type'] == 'final']}, call {arguments}")
        assert arguments == {"color": "red"}
        answered = f"The lamp is now {arguments['color']}."
        await _send(client, "tool_output", call_id=call["call_id"], output=answered)
        got = await client.until("assistant_tool_result", timeout=30)
        result = got[-1]
        assert result == {**result, "call_id": call["call_id"], "result": answered, "is_error": False}, result
        got += await _final_answer(client)
        kinds = [m["type"] for m in got]
        assert "error" not in kinds, got
        assert kinds.index("assistant_tool_result") < kinds.index("assistant"), kinds
        print(f"answer {_answer(got)!r}")
        assert _answer(got).strip()
        metrics = await metrics_text(tools_server.url)
        assert 'mediaserver_tool_calls_total{outcome="ok",server="client",tool="set_lamp_color"}' in metrics


async def test_a_device_that_does_not_answer_gives_the_model_an_error_and_the_session_goes_on(
    tools_server: LiveServer, speech: Callable[[str], Clip]
) -> None:
    """A named tool_choice in Chat Completions' nested shape; the device never answers: after
    ``assistant_client_tool_timeout_s`` (2 s here) the model gets an error result, the answer still
    comes, and an answer sent later is an error for an unknown call; the session stays."""
    nested = {"type": "function", "function": {k: v for k, v in SET_LAMP_COLOR.items() if k != "type"}}
    choice = {"type": "function", "function": {"name": "set_lamp_color"}}
    async with _device(tools_server) as client:
        await _start(client, tools=[nested], tool_choice=choice)
        await client.speak(speech("Make the lamp blue."))
        call = (await client.until("assistant_tool_call", timeout=90))[-1]
        assert call["client"] is True and call["name"] == "set_lamp_color", call
        result = (await client.until("assistant_tool_result", timeout=30))[-1]
        assert result["is_error"] is True and result["call_id"] == call["call_id"], result
        assert "did not answer within 2 seconds" in result["result"], result
        assert _answer(await _final_answer(client)).strip()
        await _send(client, "tool_output", call_id=call["call_id"], output="done")  # too late
        error = (await client.until("error", timeout=10))[-1]
        assert error["code"] == "unknown_call_id" and error["call_id"] == call["call_id"], error
        assert "no tool call" in error["message"]
        await _send(client, "ping")
        await client.until("pong", timeout=10)
        metrics = await metrics_text(tools_server.url)
        assert 'mediaserver_tool_calls_total{outcome="timeout",server="client",tool="set_lamp_color"}' in metrics


async def test_a_large_tool_output_is_cut_to_fit_and_the_answers_go_on(
    server_factory: Callable[..., Any], speech: Callable[[str], Clip]
) -> None:
    """The device answers with ``mcp_max_result_chars`` (4,000) characters of dense JSON: with the
    system prompt, the question and the call that was past ``llm_max_prompt_tokens``, and the turn
    failed with ``context_length_exceeded``. The LLM's copy is cut to fit (the device's result
    event keeps it whole), the answer follows, and so does the next turn's."""
    output = big_result()
    # The prompt fitted to the limit is ~1,750 tokens: a single-threaded engine on a loaded 2-core
    # machine reads it in about 30 s without a token.
    server: LiveServer = await server_factory(assistant_turn_timeout_s=180.0, **SETTINGS)
    async with _device(server) as client:
        await _start(client)
        await client.speak(speech("Make the lamp red."))
        call = (await client.until("assistant_tool_call", timeout=90))[-1]
        await _send(client, "tool_output", call_id=call["call_id"], output=output)
        got = await client.until("assistant_tool_result", timeout=30)
        assert got[-1]["result"] == output
        got += await _final_answer(client, timeout=240)
        assert not [m for m in got if m["type"] == "error"], got
        print(f"answer {_answer(got)!r}")
        assert _answer(got).strip()
        await client.speak(speech("Make the lamp green."))
        call = (await client.until("assistant_tool_call", timeout=90))[-1]
        await _send(client, "tool_output", call_id=call["call_id"], output="The lamp is green.")
        got = await _final_answer(client, timeout=240)
        assert not [m for m in got if m["type"] == "error"], got
        assert _answer(got).strip()


async def test_bad_tools_and_tool_outputs_are_errors_and_the_session_stays(tools_server: LiveServer) -> None:
    async with _device(tools_server) as client:
        bad_starts: list[tuple[dict[str, Any], str, str]] = [
            ({"assistant": True, "tools": "set_lamp_color"}, "tools", "'tools' must be a list"),
            (
                {"assistant": True, "tools": [{**SET_LAMP_COLOR, "parameters": {"type": "nope"}}]},
                "tools",
                "not a valid JSON Schema",
            ),
            ({"assistant": True, "tools": [{"type": "mcp", "server_label": "x"}]}, "tools", "only tools of type"),
            (
                {"assistant": True, "tools": [SET_LAMP_COLOR], "tool_choice": {"type": "function", "name": "nope"}},
                "tool_choice",
                "not in tools",
            ),
            ({"tools": [SET_LAMP_COLOR]}, "tools", "'tools' needs 'assistant': true"),
        ]
        for values, param, expected in bad_starts:
            await _send(client, "start", **values)
            error = (await client.until("error", "ready", timeout=10))[-1]
            assert error["type"] == "error" and error["code"] == "invalid_parameter", (values, error)
            assert error["param"] == param and expected in error["message"], (values, error)
        session = tools_server.app[SESSIONS].get(tools_server.app[SESSIONS].ids()[-1])
        assert getattr(session, "assistant", "?") is None and getattr(session, "config", "?") is None
        for fields, code, expected in [
            ({"call_id": "call_nope", "output": "done"}, "unknown_call_id", "no tool call 'call_nope' is waiting"),
            ({"output": "done"}, "invalid_parameter", "needs 'call_id'"),
            ({"call_id": "call_nope"}, "invalid_parameter", "needs 'output'"),
            ({"call_id": "call_nope", "output": "x", "is_error": "yes"}, "invalid_parameter", "'is_error' must be"),
        ]:
            await _send(client, "tool_output", **fields)
            error = (await client.until("error", timeout=10))[-1]
            assert error["code"] == code and expected in error["message"], (fields, error)
        await _send(client, "ping")
        await client.until("pong", timeout=10)
        assert (await _start(client))["tools"] == ["set_lamp_color"]  # and a good start works


@pytest.mark.parametrize("how", ["close", "drop"])
async def test_hanging_up_while_a_call_waits_ends_the_wait_at_once(
    server_factory: Callable[..., Any], speech: Callable[[str], Clip], how: str
) -> None:
    """The device goes away while the turn waits for its answer (the timeout is a minute), with a
    close frame or by dropping the connection: the session and everything it ran are gone within
    seconds."""
    server: LiveServer = await server_factory(
        assistant_client_tool_timeout_s=60.0, assistant_turn_timeout_s=120.0, **SETTINGS
    )
    async with _device(server) as client:
        await _start(client)
        session_id = server.app[SESSIONS].ids()[-1]
        await client.speak(speech("Make the lamp red."))
        await client.until("assistant_tool_call", timeout=90)
        assert session_tasks(session_id)
        if how == "drop":
            abort_ws(client.ws)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (session_id in server.app[SESSIONS].ids() or session_tasks(session_id)):
        await asyncio.sleep(0.05)
    assert session_id not in server.app[SESSIONS].ids()
    assert not session_tasks(session_id)


async def test_a_device_tool_may_not_take_an_operator_tool_name(
    server_factory: Callable[..., Any], tmp_path: Path
) -> None:
    """The operator's MCP tools win a clash: ``set_light`` beside the light server's is refused at
    start, naming the tool; another name is fine."""
    lights = McpServerConfig(
        name="lights",
        command=sys.executable,
        args=["-m", "tests.mcp_light_server", "--state", str(tmp_path / "lights.json"), "stdio"],
        env={"PYTHONPATH": str(ROOT)},
        allowed_tools=["set_light"],
    )
    server: LiveServer = await server_factory(mcp_servers=[lights], **SETTINGS)
    async with _device(server) as client:
        await _send(client, "start", assistant=True, speak=False, tools=[{**SET_LAMP_COLOR, "name": "set_light"}])
        error = (await client.until("error", "ready", timeout=10))[-1]
        assert error["type"] == "error" and error["param"] == "tools", error
        assert "'set_light' is already a tool of this server's MCP servers" in error["message"], error
        assert (await _start(client))["tools"] == ["set_lamp_color"]
