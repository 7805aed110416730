"""Client-side tools of the WebRTC voice loop: a peer (aiortc) declares a function in ``start.obj``,
says "Make the page red." (Piper), gets the model's call over the data channel
(``assistant_tool_call`` with ``"client": true``), answers it (``tool_output``), and the answer is
spoken on the outbound track.

The LLM is the bundled SmolLM2-135M on the server's own llama-server engine; it never chooses a tool
by itself (tests/integration/test_chat_tools.py), so the peer forces one (``tool_choice``
``required``), which that engine constrains to a valid call (mediaserver.llm.forced_calls). The
colour is the model's, from the transcript, within the schema's enum.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

import pytest_asyncio

from mediaserver.asr.service import AsrService
from mediaserver.assistant.client_tools import ClientToolbox, SessionToolbox, parse_client_tools
from mediaserver.assistant.turn_types import AssistantOptions
from mediaserver.assistant.turns import Assistant
from mediaserver.config import McpServerConfig, Settings
from mediaserver.events import AssistantText, AssistantToolCall, AssistantToolResult, SessionEvent
from mediaserver.llm.service import LlmService
from mediaserver.metrics import Metrics
from mediaserver.state import SESSIONS
from tests.conftest import Clip, LiveServer
from tests.faults import metrics_text, session_tasks
from tests.integration.test_voice_loop import llm_busy, transcribe
from tests.rtc_peer import Peer, answer_frames_arrived, connect

ROOT = Path(__file__).resolve().parents[2]
COLORS = ["red", "green", "blue", "yellow", "white", "black"]
PARAMETERS = {
    "type": "object",
    "properties": {"color": {"type": "string", "enum": COLORS, "description": "the new background colour"}},
    "required": ["color"],
}
# The Realtime (flat) shape, and the same function as Chat Completions nests it.
SET_PAGE_COLOR = {
    "type": "function",
    "name": "set_page_color",
    "description": "Change the background colour of the web page.",
    "parameters": PARAMETERS,
}
SET_PAGE_COLOR_NESTED = {
    "type": "function",
    "function": {k: v for k, v in SET_PAGE_COLOR.items() if k != "type"},
}
SETTINGS: dict[str, Any] = {
    "assistant_temperature": 0.0,
    # Room for the bundled model's forced call (31-37 tokens for a colour on the embedded engine):
    # a cap that cuts it leaves the call not run (tool_rounds.py), as 30 did test_browser_page_tool.py's in CI.
    "assistant_max_answer_tokens": 60,
    "assistant_system_prompt": "You are a voice assistant that controls a web page.",
    "mcp_max_calls_per_turn": 1,
}


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def tools_server(server_factory: Callable[..., Any]) -> LiveServer:
    server: LiveServer = await server_factory(assistant_client_tool_timeout_s=2.0, **SETTINGS)
    return server


async def _start(peer: Peer, tools: list[Any], **extra: Any) -> None:
    obj = {"hands_free": True, "assistant": True, "tools": tools, "tool_choice": "required", **extra}
    peer.send("start", obj)
    log = await peer.next(timeout=10)
    assert log["type"] == "log" and log["message"].startswith("ASR hands-free"), log


async def _until(peer: Peer, kind: str, got: list[dict[str, Any]], timeout: float = 90.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        msg = await peer.next(timeout=max(0.05, deadline - time.monotonic()))
        got.append(msg)
        if msg["type"] == kind:
            return msg


async def test_the_page_runs_its_tool_and_the_answer_is_spoken(
    tools_server: LiveServer, speech: Callable[[str], Clip], asr_service: AsrService
) -> None:
    peer = await connect(tools_server)
    try:
        await _start(peer, [SET_PAGE_COLOR])
        peer.track.play(speech("Make the page red."), silence_after_s=1.0)
        got: list[dict[str, Any]] = []
        call = (await _until(peer, "assistant_tool_call", got))["obj"]
        assert call["client"] is True and call["name"] == "set_page_color", call
        arguments = json.loads(call["arguments"])
        print(f"heard {[m['obj']['text'] for m in got if m['type'] == 'infer']}, call {arguments}")
        assert arguments == {"color": "red"}
        # The page runs it and answers.
        answered = f"The page background is now {arguments['color']}."
        peer.send("tool_output", {"call_id": call["call_id"], "output": answered})
        result = (await _until(peer, "assistant_tool_result", got))["obj"]
        assert result == {**result, "call_id": call["call_id"], "result": answered, "is_error": False}
        mark = time.monotonic()
        stopped = await _until(peer, "assistant_audio_stopped", got)
        assert stopped["obj"]["interrupted"] is False
        kinds = [m["type"] for m in got]
        assert kinds.index("assistant_tool_result") < kinds.index("assistant_audio_started"), kinds
        await answer_frames_arrived(peer, tools_server.app)  # the last frames in flight
        audio = peer.received_audio(since=mark - 1.0)
        assert len(audio) > 48000 // 2, len(audio)  # the answer after the call was spoken
        answer = next(m["obj"]["full"] for m in got if m["type"] == "assistant" and m["obj"]["final"])
        heard = await transcribe(asr_service, audio, 48000)
        print(f"answer {answer!r}; heard {heard!r}")
        assert answer.strip() and heard.strip()
        metrics = await metrics_text(tools_server.url)
        assert 'mediaserver_tool_calls_total{outcome="ok",server="client",tool="set_page_color"}' in metrics
    finally:
        await peer.close()


async def test_a_page_that_does_not_answer_gives_the_model_an_error_and_the_turn_goes_on(
    tools_server: LiveServer, speech: Callable[[str], Clip]
) -> None:
    """The page declares its tool in Chat Completions' nested shape with a named tool_choice, and
    never answers: after ``assistant_client_tool_timeout_s`` (2 s here) the model gets an error
    result, the answer is still spoken, and an answer that comes later is an error for an unknown
    call; the session stays."""
    peer = await connect(tools_server)
    try:
        choice = {"type": "function", "function": {"name": "set_page_color"}}
        await _start(peer, [SET_PAGE_COLOR_NESTED], tool_choice=choice)
        peer.track.play(speech("Make the page blue."), silence_after_s=1.0)
        got: list[dict[str, Any]] = []
        call = (await _until(peer, "assistant_tool_call", got))["obj"]
        assert call["client"] is True and call["name"] == "set_page_color", call
        result = (await _until(peer, "assistant_tool_result", got, timeout=30))["obj"]
        assert result["is_error"] is True and result["call_id"] == call["call_id"], result
        assert "did not answer within 2 seconds" in result["result"], result
        stopped = await _until(peer, "assistant_audio_stopped", got)
        assert stopped["obj"]["interrupted"] is False
        assert "assistant_audio_started" in [m["type"] for m in got]
        # Too late: the call is no longer waiting.
        peer.send("tool_output", {"call_id": call["call_id"], "output": "done"})
        error = await peer.next("error", timeout=10)
        assert error["obj"] == {"code": "unknown_call_id", "call_id": call["call_id"]}, error
        assert "no tool call" in error["message"]
        peer.send("ping", message="still here")
        assert (await peer.next("pong"))["message"] == "still here"
        metrics = await metrics_text(tools_server.url)
        assert 'mediaserver_tool_calls_total{outcome="timeout",server="client",tool="set_page_color"}' in metrics
    finally:
        await peer.close()


async def test_bad_tools_and_tool_outputs_are_errors_and_the_session_stays(tools_server: LiveServer) -> None:
    peer = await connect(tools_server)
    try:
        bad_starts: list[tuple[dict[str, Any], str]] = [
            ({"assistant": True, "tools": "set_page_color"}, "'tools' must be a list"),
            (
                {"assistant": True, "tools": [{**SET_PAGE_COLOR, "parameters": {"type": "nope"}}]},
                "not a valid JSON Schema",
            ),
            ({"assistant": True, "tools": [{**SET_PAGE_COLOR, "name": "set page color"}]}, "letters, digits"),
            ({"assistant": True, "tools": [{"type": "mcp", "server_label": "x"}]}, "only tools of type 'function'"),
            ({"assistant": True, "tools": [SET_PAGE_COLOR, SET_PAGE_COLOR_NESTED]}, "twice"),
            (
                {"assistant": True, "tools": [SET_PAGE_COLOR], "tool_choice": {"type": "function", "name": "nope"}},
                "not in tools",
            ),
            ({"assistant": True, "tool_choice": "required"}, "the request has no tools"),
            ({"tools": [SET_PAGE_COLOR]}, "'tools' needs 'assistant': true"),
        ]
        for obj, expected in bad_starts:
            peer.send("start", obj)
            error = await peer.next("error", timeout=10)
            assert expected in error["message"], (obj, error)
        session = tools_server.app[SESSIONS].get(tools_server.app[SESSIONS].ids()[-1])
        assert getattr(session, "assistant", "?") is None  # nothing of a bad start was applied
        for obj, expected in [
            ({"call_id": "call_nope", "output": "done"}, "no tool call 'call_nope' is waiting"),
            ({"output": "done"}, "needs 'call_id'"),
            ({"call_id": "call_nope"}, "needs 'output'"),
            ({"call_id": "call_nope", "output": "x", "is_error": "yes"}, "'is_error' must be true or false"),
        ]:
            peer.send("tool_output", obj)
            error = await peer.next("error", timeout=10)
            assert expected in error["message"], (obj, error)
        peer.send("ping", message="still here")
        assert (await peer.next("pong"))["message"] == "still here"
        await _start(peer, [SET_PAGE_COLOR])  # and a good start works
    finally:
        await peer.close()


async def test_hanging_up_while_a_call_waits_ends_the_wait_at_once(
    server_factory: Callable[..., Any], speech: Callable[[str], Clip]
) -> None:
    """The page goes away while the turn waits for its answer (the timeout is a minute): the
    session and everything it ran are gone within seconds."""
    server: LiveServer = await server_factory(
        assistant_client_tool_timeout_s=60.0, assistant_turn_timeout_s=120.0, **SETTINGS
    )
    peer = await connect(server)
    try:
        await _start(peer, [SET_PAGE_COLOR])
        session_id = server.app[SESSIONS].ids()[-1]
        peer.track.play(speech("Make the page red."), silence_after_s=1.0)
        await _until(peer, "assistant_tool_call", [])
        assert session_tasks(session_id)
    finally:
        await peer.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (session_id in server.app[SESSIONS].ids() or session_tasks(session_id)):
        await asyncio.sleep(0.05)
    assert session_id not in server.app[SESSIONS].ids()
    assert not session_tasks(session_id)


async def test_a_page_tool_may_not_take_an_operator_tool_name(
    server_factory: Callable[..., Any], tmp_path: Path
) -> None:
    """The operator's MCP tools win a clash: a page declaring ``set_light`` beside the light
    server's is refused at start, naming the tool."""
    lights = McpServerConfig(
        name="lights",
        command=sys.executable,
        args=["-m", "tests.mcp_light_server", "--state", str(tmp_path / "lights.json"), "stdio"],
        env={"PYTHONPATH": str(ROOT)},
        allowed_tools=["set_light"],
    )
    server: LiveServer = await server_factory(mcp_servers=[lights], **SETTINGS)
    peer = await connect(server)
    try:
        mine = {**SET_PAGE_COLOR, "name": "set_light"}
        peer.send("start", {"hands_free": True, "assistant": True, "tools": [mine]})
        error = await peer.next("error", timeout=10)
        assert "'set_light' is already a tool of this server's MCP servers" in error["message"], error
        await _start(peer, [SET_PAGE_COLOR])  # another name is fine
    finally:
        await peer.close()


class ParkedGate(asyncio.Event):
    """A speculative turn's release gate that tells when the answer has reached it and waits there."""

    def __init__(self) -> None:
        super().__init__()
        self.parked = asyncio.Event()

    async def wait(self) -> Literal[True]:
        if not self.is_set():
            self.parked.set()
        return await super().wait()


async def test_a_speculative_answer_calls_no_tool_before_it_is_released(
    base_settings: Settings, llm_service: LlmService
) -> None:
    """An answer started during a pause (semantic turns) writes its call, but nothing is sent to
    the page until the turn has ended: dropped, the page never saw it; released, the call goes out."""
    settings = base_settings.model_copy(update=SETTINGS)
    events: list[SessionEvent] = []

    async def emit(event: SessionEvent) -> None:
        events.append(event)

    options = replace(AssistantOptions.from_settings(settings), speak=False)
    assistant = Assistant(llm_service, None, settings, options, emit, None, Metrics())
    client = ClientToolbox(settings, Metrics())
    client.declare(parse_client_tools([SET_PAGE_COLOR], "required"))
    assistant.toolbox = SessionToolbox(client, None)

    def speculate(text: str) -> tuple[asyncio.Task[None], ParkedGate]:
        """Start a speculative answer and watch its release gate (set before its task first runs)."""
        assert assistant.speculate(text)
        assert assistant._speculation is not None
        _, turn, task = assistant._speculation
        gate = ParkedGate()
        turn._release = gate
        return task, gate

    async def first_round_written(gate: ParkedGate) -> None:
        """The engine took the generation and finished it, and the answer now waits at its release
        gate: whatever it would send before being released has been sent by now."""
        async with asyncio.timeout(60):
            while not llm_busy(llm_service):
                await asyncio.sleep(0.01)
            while llm_busy(llm_service):
                await asyncio.sleep(0.01)
            await gate.parked.wait()

    try:
        task, gate = speculate("Make the page red.")
        await first_round_written(gate)
        assert events == [] and client.waiting == []  # written, held: nothing went to the page
        assistant.drop_speculation()
        async with asyncio.timeout(30):
            await asyncio.wait({task})  # the dropped answer has ended: it sent what it ever will
        assert task.cancelled()
        assert events == [] and client.waiting == []

        _, gate = speculate("Make the page green.")
        await first_round_written(gate)
        assert events == [] and client.waiting == []
        await assistant.answer("Make the page green.")  # the turn ended as speculated: released
        async with asyncio.timeout(30):
            while not client.waiting:
                await asyncio.sleep(0.01)
        call = next(e for e in events if isinstance(e, AssistantToolCall))
        assert call.client and client.waiting == [call.call_id]
        assert client.answer(call.call_id, "The page background is now green.")
        async with asyncio.timeout(60):
            while not any(isinstance(e, AssistantText) and e.final for e in events):
                await asyncio.sleep(0.05)
        result = next(e for e in events if isinstance(e, AssistantToolResult))
        assert result.result == "The page background is now green." and not result.is_error
    finally:
        await assistant.aclose()
