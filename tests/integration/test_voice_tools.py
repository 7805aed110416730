"""The voice loop calls MCP tools: "Turn on the kitchen light." spoken (Piper) over the device
WebSocket, heard by the server's ASR, answered by the LLM with a call to a real MCP server's
``set_light`` (tests/mcp_light_server.py, a stdio child of mediaserver or over streamable HTTP),
whose state changes; the result goes back to the LLM and the answer is spoken.

The LLM is the bundled SmolLM2-135M, on the server's own llama-server engine (a forced call
constrained by mediaserver.llm.forced_calls) or on llama-cpp-python's server with grammar-constrained
calls (an upstream). That model never chooses a tool by itself (tests/integration/test_chat_tools.py prints how often),
so these tests set ``mcp_tool_choice=required`` and offer only ``set_light`` (``allowed_tools``);
which light and on/off are the model's, from the transcript.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
import pytest_asyncio

from mediaserver.asr.service import AsrService
from mediaserver.assistant.mcp import McpToolbox
from mediaserver.assistant.tool_rounds import ToolRounds
from mediaserver.config import McpServerConfig, Settings
from mediaserver.events import AssistantToolCall, AssistantToolResult
from mediaserver.llm.service import LlmService
from mediaserver.llm.types import ChatMessage, GenerationParams
from mediaserver.metrics import Metrics
from mediaserver.state import TOOLS
from tests.conftest import Clip, LiveServer
from tests.integration.test_mcp_tools import wait_listening
from tests.integration.test_voice_loop import WsClient, transcribe
from tests.llama_upstream import llama_server
from tests.ports import free_port

MODEL = "smollm2-voice-tools"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tools_upstream() -> Iterator[str]:
    with llama_server(MODEL, "--chat_format", "chatml-function-calling") as url:
        yield url


def _stdio(state: Path, **extra: Any) -> McpServerConfig:
    return McpServerConfig(
        name="lights",
        command=sys.executable,
        args=["-m", "tests.mcp_light_server", "--state", str(state), "stdio"],
        env={"PYTHONPATH": str(ROOT)},
        **extra,
    )


@pytest_asyncio.fixture(loop_scope="session")
async def voice_tools_server(
    server_factory: Callable[..., Any], base_settings: Settings, tools_upstream: str
) -> AsyncIterator[Callable[..., Any]]:
    services: list[LlmService] = []

    async def start(*servers: McpServerConfig, engine: str = "upstream", **overrides: Any) -> LiveServer:
        settings: dict[str, Any] = {
            "assistant_temperature": 0.0,
            # The bundled model's forced set_light call alone takes ~40 tokens on the embedded engine:
            # a cap of 40 could cut it (its arguments), as 30 cut test_browser_page_tool.py's in CI.
            "assistant_max_answer_tokens": 60,
            "assistant_system_prompt": "You are a voice assistant that controls the lights in the house.",
            "mcp_servers": list(servers),
            "mcp_tool_choice": "required",
            "mcp_max_calls_per_turn": 1,
            **overrides,
        }
        if engine == "embedded":  # the test session's shared engine
            embedded: LiveServer = await server_factory(**settings)
            return embedded
        settings["llm_upstream_url"] = tools_upstream
        service = LlmService(base_settings.model_copy(update=settings), Metrics())
        services.append(service)
        await service.start()
        server: LiveServer = await server_factory(llm=service, **settings)
        return server

    yield start
    for service in services:
        await service.aclose()


async def _ask(server: LiveServer, clip: Clip) -> tuple[list[dict[str, Any]], WsClient, Any]:
    http = aiohttp.ClientSession()
    ws = await http.ws_connect(f"{server.url}/api/ws/asr")
    client = WsClient(ws)
    await ws.send_str(json.dumps({"type": "start", "mode": "server_vad", "assistant": True}))
    await client.until("ready")
    await client.speak(clip)
    messages = await client.until("assistant_audio_stopped", timeout=120)
    return messages, client, http


@pytest.mark.parametrize("engine", ["embedded", "upstream"])
async def test_turn_on_the_kitchen_light_by_voice(
    voice_tools_server: Callable[..., Any],
    speech: Callable[[str], Clip],
    asr_service: AsrService,
    tmp_path: Path,
    engine: str,
) -> None:
    state = tmp_path / "lights.json"
    server = await voice_tools_server(_stdio(state, allowed_tools=["set_light"]), engine=engine)
    messages, client, http = await _ask(server, speech("Turn on the kitchen light."))
    try:
        kinds = [m["type"] for m in messages]
        call = next(m for m in messages if m["type"] == "assistant_tool_call")
        result = next(m for m in messages if m["type"] == "assistant_tool_result")
        assert call["name"] == "set_light" and result["call_id"] == call["call_id"]
        assert (
            kinds.index("assistant_tool_call")
            < kinds.index("assistant_tool_result")
            < kinds.index("assistant_audio_started")
        )
        assert not result["is_error"], result
        # The MCP server's state changed: the kitchen light is on.
        assert json.loads(state.read_text()) == {"kitchen": True}, (call, result)
        answer = next(m["text"] for m in messages if m["type"] == "assistant" and m["final"])
        pcm = np.frombuffer(b"".join(client.audio), dtype="<i2").astype(np.float32) / 32768.0
        heard = await transcribe(asr_service, pcm, 16000)
        print(f"call {call['arguments']} -> {result['result']!r}; answer {answer!r}; heard {heard!r}")
        assert answer.strip() and heard.strip()  # the answer after the call was spoken
        async with http.get(f"{server.url}/metrics") as resp:
            metrics = await resp.text()
        assert 'mediaserver_tool_calls_total{outcome="ok",server="lights",tool="set_light"}' in metrics
    finally:
        await client.ws.close()
        await http.close()


@pytest.fixture
def http_lights(tmp_path: Path) -> Iterator[tuple[str, Path, subprocess.Popen[bytes]]]:
    """The light server over streamable HTTP, for a test to stop: URL, state file, process."""
    state = tmp_path / "lights.json"
    port = free_port()
    command = [sys.executable, "-m", "tests.mcp_light_server", "--state", str(state), "http", "--port", str(port)]
    process = subprocess.Popen(command, cwd=ROOT)
    try:
        wait_listening(port, process)
        yield f"http://127.0.0.1:{port}/mcp", state, process
    finally:
        process.terminate()
        process.wait(10)


async def test_a_server_that_went_down_gives_an_error_result_and_the_answer_goes_on(
    voice_tools_server: Callable[..., Any],
    speech: Callable[[str], Clip],
    http_lights: tuple[str, Path, subprocess.Popen[bytes]],
) -> None:
    """The tool's server (streamable HTTP) stops after mediaserver listed its tools: the call's
    result is an error given to the model, the answer is still spoken, the server's tools are
    withdrawn and the session takes the next turn without them."""
    url, state, process = http_lights
    config = McpServerConfig(name="lights", url=url, allowed_tools=["set_light"])
    # (No liveness checks: the server dies between two, and the user's call finds it gone.)
    server = await voice_tools_server(config, mcp_reconnect_s=600, mcp_check_s=0)
    assert [t.name for t in server.app[TOOLS].tools()] == ["set_light"]
    process.terminate()  # the server goes away; mediaserver still lists its tool
    await asyncio.to_thread(process.wait, 10)
    messages, client, http = await _ask(server, speech("Turn on the kitchen light."))
    try:
        result = next(m for m in messages if m["type"] == "assistant_tool_result")
        assert result["is_error"], result
        print(f"result of a call to a stopped server: {result['result']!r}")
        assert messages[-1]["type"] == "assistant_audio_stopped"
        assert not state.exists()
        async with http.get(f"{server.url}/metrics") as resp:
            metrics = await resp.text()
        # Counted as the server being away, not as the tool failing.
        assert 'mediaserver_tool_calls_total{outcome="unavailable",server="lights",tool="set_light"}' in metrics
        # The call found the connection closed: the server's tools are withdrawn until it is back
        # (mcp_reconnect_s), and the session takes another turn, answered without them.
        assert server.app[TOOLS].tools() == []
        await client.speak(speech("Turn on the kitchen light."))
        again = await client.until("assistant_audio_stopped", timeout=120)
        assert not any(m["type"] == "assistant_tool_call" for m in again), again
        assert any(m["type"] == "assistant" and m["final"] for m in again), again
    finally:
        await client.ws.close()
        await http.close()


async def _kitchen_rounds(
    llm: LlmService, settings: Settings, metrics: Metrics, *, max_tokens: int, max_calls: int
) -> tuple[ToolRounds, str, list[AssistantToolCall], list[AssistantToolResult]]:
    """ "Turn on the kitchen light." through ``ToolRounds`` with the settings' MCP servers, the first
    round forced to call: the rounds, the answer's text, and the calls and results emitted."""
    toolbox = McpToolbox(settings, metrics)
    await toolbox.start()
    events: list[Any] = []

    async def emit(event: Any) -> None:
        events.append(event)

    try:
        messages = [ChatMessage("user", "Turn on the kitchen light.")]
        config = ToolRounds.config(toolbox, "required")
        params = GenerationParams(max_tokens=max_tokens, temperature=0.0, tools=config)
        rounds = ToolRounds(llm, toolbox, messages, params, None, emit, 1, max_calls, lambda: None)
        async with llm.stream(messages, params) as first:
            text = "".join([delta async for delta in rounds.text(first)])
    finally:
        await toolbox.aclose()
    calls = [e for e in events if isinstance(e, AssistantToolCall)]
    results = [e for e in events if isinstance(e, AssistantToolResult)]
    return rounds, text, calls, results


async def test_calls_past_the_cap_are_refused_and_the_answer_has_no_tools(
    base_settings: Settings, tools_upstream: str, tmp_path: Path
) -> None:
    """``mcp_max_calls_per_turn``: a call past the cap is not run; its result says so, and the
    answer's last round goes without tools. (The cap is 0 here, below what settings allow, so the
    model's first, forced call is already past it.)"""
    state = tmp_path / "lights.json"
    settings = base_settings.model_copy(
        update={"llm_upstream_url": tools_upstream, "mcp_servers": [_stdio(state, allowed_tools=["set_light"])]}
    )
    llm = LlmService(settings, Metrics())
    await llm.start()
    try:
        rounds, text, calls, results = await _kitchen_rounds(llm, settings, Metrics(), max_tokens=30, max_calls=0)
    finally:
        await llm.aclose()
    assert [c.name for c in calls] == ["set_light"] and len(results) == 1
    assert results[0].is_error and "mcp_max_calls_per_turn" in results[0].result
    assert not state.exists()  # the call was not run
    assert rounds.calls == 0 and rounds.last is not None and not rounds.last.tool_calls
    print(f"answer after the refused call: {text!r}")


CUT_TOKENS = 20  # where the bundled model's forced call of set_light is cut, in its arguments


async def test_a_call_cut_off_at_the_token_cap_is_not_run_and_the_answer_goes_on(
    base_settings: Settings, llm_service: LlmService, tmp_path: Path
) -> None:
    """A call the answer's token cap stopped while its arguments were written is not run: its result
    tells the model why, and the next round (on the embedded engine, given the cut call in its
    history) is answered. Before, the call went to the tool, and the engine refused the history
    (a 500: the arguments do not parse), which failed the turn with nothing said."""
    state = tmp_path / "lights.json"
    settings = base_settings.model_copy(update={"mcp_servers": [_stdio(state, allowed_tools=["set_light"])]})
    metrics = Metrics()
    rounds, text, calls, results = await _kitchen_rounds(
        llm_service, settings, metrics, max_tokens=CUT_TOKENS, max_calls=1
    )
    print(f"cut call {[c.arguments for c in calls]}, result {[r.result for r in results]}, answer {text!r}")
    assert [c.name for c in calls] == ["set_light"] and not calls[0].client and len(results) == 1
    with pytest.raises(ValueError):
        json.loads(calls[0].arguments)
    expected = "Error: not run: the call was cut off where the answer reached its token limit."
    assert results[0].is_error and results[0].result == expected
    refused = {"server": "lights", "tool": "set_light", "outcome": "refused"}
    assert metrics.registry.get_sample_value("mediaserver_tool_calls_total", refused) == 1
    assert not state.exists()  # the call was not run
    assert rounds.calls == 1 and rounds.last is not None and not rounds.last.tool_calls
    assert text.strip()
