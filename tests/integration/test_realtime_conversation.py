"""OpenAI Realtime conversation sessions at /v1/realtime against the live server: the official SDK's
realtime client and raw beta-shaped events over ``websockets``, answered by the real voice loop
(the bundled SmolLM2, greedy, and Piper), the answer's audio decoded and transcribed back."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import numpy as np
import openai
import pytest
import pytest_asyncio
import websockets
from openai.types.beta.realtime import RealtimeServerEvent as BetaServerEvent
from openai.types.realtime import RealtimeServerEvent
from pydantic import TypeAdapter

from mediaserver.asr.service import AsrService
from mediaserver.llm.service import LlmService
from mediaserver.state import ASR, SESSIONS
from mediaserver.tts.service import TtsService
from tests.conftest import Clip, LiveServer
from tests.faults import tasks_ended
from tests.integration.test_realtime import RATE, chunks, pcm16
from tests.integration.test_voice_loop import (
    ANSWER_WORD,
    LONG_QUESTION,
    QUESTION,
    VOICE_SETTINGS,
    llm_busy,
    transcribe,
    tts_open_streams,
)

ERROR_KEYS = {"type", "code", "message", "param", "event_id"}
TEXT_ONLY = {"type": "realtime", "output_modalities": ["text"]}
ANSWER_EVENTS_GA = [
    "response.created",
    "response.output_item.added",
    "conversation.item.added",
    "response.content_part.added",
    "response.output_audio_transcript.delta",
    "response.output_audio.delta",
    "response.output_audio.done",
    "response.output_audio_transcript.done",
    "response.content_part.done",
    "response.output_item.done",
    "conversation.item.done",
    "response.done",
]


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def conv_server(server_factory: Callable[..., Any]) -> LiveServer:
    # Answer audio as fast as it is synthesized, as OpenAI sends it (the interruption test paces it).
    server: LiveServer = await server_factory(**VOICE_SETTINGS, realtime_audio_lead_ms=600_000)
    return server


def sdk(server: LiveServer) -> Any:
    """The SDK's client, typed loosely: its events are a union of 46 models, read here by attribute."""
    return openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


# Every server event is validated against the SDK's models (the SDK itself only constructs them).
GA_EVENTS: TypeAdapter[Any] = TypeAdapter(RealtimeServerEvent)
BETA_EVENTS: TypeAdapter[Any] = TypeAdapter(BetaServerEvent)


async def until(connection: Any, *kinds: str, timeout: float = 60.0) -> list[Any]:
    """Events up to and including the first of ``kinds``, each validated by the SDK's models."""
    got: list[Any] = []  # the SDK's typed events, read by attribute
    async with asyncio.timeout(timeout):
        while True:
            event = GA_EVENTS.validate_json(await connection.recv_bytes())
            got.append(event)
            if event.type in kinds:
                return got


def in_order(kinds: list[str], expected: list[str]) -> bool:
    """``expected`` is a subsequence of ``kinds`` (each found after the one before it)."""
    position = 0
    for kind in expected:
        if kind not in kinds[position:]:
            return False
        position = kinds.index(kind, position) + 1
    return True


def audio_of(events: list[Any], kind: str = "response.output_audio.delta") -> np.ndarray:
    data = b"".join(
        base64.b64decode(e.delta if hasattr(e, "delta") else e["delta"]) for e in events if _type(e) == kind
    )
    return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0


def _type(event: Any) -> str:
    return str(event["type"] if isinstance(event, dict) else event.type)


# --- the SDK -------------------------------------------------------------------------------------------


async def test_sdk_text_turn(conv_server: LiveServer) -> None:
    async with sdk(conv_server).realtime.connect(model="gpt-realtime") as connection:
        created = await connection.recv()
        assert created.type == "session.created"
        session = created.session
        assert session.type == "realtime" and session.object == "realtime.session" and session.model == "gpt-realtime"
        assert session.output_modalities == ["audio"] and session.audio.output.format.rate == 24000
        await connection.session.update(
            session={**TEXT_ONLY, "instructions": VOICE_SETTINGS["assistant_system_prompt"]}
        )
        updated = await connection.recv()
        assert updated.type == "session.updated" and updated.session.output_modalities == ["text"]
        await connection.conversation.item.create(
            item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": QUESTION}]}
        )
        added = await connection.recv()
        assert added.type == "conversation.item.added" and added.item.role == "user"
        assert added.item.content[0].text == QUESTION
        assert (await connection.recv()).type == "conversation.item.done"
        await connection.response.create(response={"metadata": {"client_event_id": "turn-1"}})
        events = await until(connection, "response.done")
    kinds = [e.type for e in events]
    assert in_order(
        kinds,
        [
            "response.created",
            "response.output_item.added",
            "conversation.item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "conversation.item.done",
            "response.done",
        ],
    ), kinds
    assert "response.output_audio.delta" not in kinds
    created_response = events[0].response
    assert created_response.status == "in_progress" and created_response.metadata == {"client_event_id": "turn-1"}
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    done_text = next(e for e in events if e.type == "response.output_text.done").text
    assert done_text == text and ANSWER_WORD in text.lower(), text
    response = events[-1].response
    assert response.status == "completed" and response.id == created_response.id
    assert response.output[0].content[0].text == text and response.output[0].status == "completed"
    assert response.usage.output_tokens > 0 and response.usage.input_tokens > 0
    assert response.usage.total_tokens == response.usage.input_tokens + response.usage.output_tokens

    # A second response over the same conversation: its prompt starts with the first one's, which the
    # engine's prompt cache holds, and the usage says so (it used to say 0 whatever the cache held).
    async with sdk(conv_server).realtime.connect(model="gpt-realtime") as connection:
        await until(connection, "session.created")
        await connection.session.update(
            session={**TEXT_ONLY, "instructions": VOICE_SETTINGS["assistant_system_prompt"]}
        )
        await until(connection, "session.updated")
        for turn in ("turn-1", "turn-2"):
            await connection.conversation.item.create(
                item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": QUESTION}]}
            )
            await connection.response.create(response={"metadata": {"client_event_id": turn}})
            usage = (await until(connection, "response.done"))[-1].response.usage
        details = usage.input_token_details
        assert details is not None and details.cached_tokens is not None and details.cached_tokens_details is not None
        assert usage.input_tokens // 2 <= details.cached_tokens < usage.input_tokens, usage
        assert details.cached_tokens_details.text_tokens == details.cached_tokens


async def test_responses_in_a_row_and_a_cancelled_ones_usage(conv_server: LiveServer) -> None:
    """``response.create`` with no new user item (LiveKit's generate_reply, "say more"), and after
    an assistant item the client added, answers each time; a response cancelled midway reports the
    tokens it took (it said 0 and 0)."""
    async with sdk(conv_server).realtime.connect(model="gpt-realtime") as connection:
        await until(connection, "session.created")
        await connection.session.update(session=TEXT_ONLY)
        await until(connection, "session.updated")
        await connection.conversation.item.create(
            item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": QUESTION}]}
        )
        await connection.conversation.item.create(
            item={"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me see."}]}
        )
        inputs = []
        for _ in range(3):  # the engine refused the third with "2 or more assistant messages at the end"
            await connection.response.create(response={"max_output_tokens": 16})
            response = (await until(connection, "response.done"))[-1].response
            assert response.status in ("completed", "incomplete"), response.status_details
            assert response.output[0].content[0].text
            inputs.append(response.usage.input_tokens)
        assert inputs == sorted(inputs) and len(set(inputs)) == 3, inputs  # each answer joined the history

        await connection.conversation.item.create(
            item={
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "Tell me a long story about a dragon and a knight."}],
            }
        )
        await connection.response.create()
        events = await until(connection, "response.output_text.delta")
        await connection.response.cancel()
        events += await until(connection, "response.done")
    response = events[-1].response
    assert response.status == "cancelled", response.status
    deltas = sum(1 for e in events if e.type == "response.output_text.delta")
    assert response.usage.input_tokens > inputs[-1], response.usage
    assert response.usage.output_tokens >= deltas >= 1, (response.usage, deltas)
    assert response.usage.total_tokens == response.usage.input_tokens + response.usage.output_tokens


WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather now in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


async def test_a_responses_own_tools_and_tool_choice(conv_server: LiveServer) -> None:
    """``response.create``'s ``tools`` and ``tool_choice`` are that response's (they were ignored: a
    client's ``tool_choice: "none"`` for one response still got the session's)."""
    light = {
        "type": "function",
        "name": "set_light",
        "description": "Turn a light on or off",
        "parameters": {"type": "object", "properties": {"on": {"type": "boolean"}}, "required": ["on"]},
    }
    async with sdk(conv_server).realtime.connect(model="gpt-realtime") as connection:
        await until(connection, "session.created")
        await connection.session.update(
            session={**TEXT_ONLY, "tools": [light], "tool_choice": "none", "max_output_tokens": 80}
        )
        await until(connection, "session.updated")
        await connection.conversation.item.create(
            item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Lights on, please."}]}
        )
        forced = {"type": "function", "name": "set_light"}
        await connection.response.create(response={"tool_choice": forced})
        calls = [o for o in (await until(connection, "response.done"))[-1].response.output if o.type == "function_call"]
        assert [c.name for c in calls] == ["set_light"], calls
        await connection.response.create(response={"tools": [WEATHER_TOOL], "tool_choice": "required"})
        calls = [o for o in (await until(connection, "response.done"))[-1].response.output if o.type == "function_call"]
        assert [c.name for c in calls] == ["get_weather"], calls  # this response's tools, not the session's
        await connection.response.create(response={"max_output_tokens": 8})  # the session's: none
        output = (await until(connection, "response.done"))[-1].response.output
        assert [o.type for o in output] == ["message"], output
        for response, param in (
            ({"tool_choice": {"type": "function", "name": "open_door"}}, "response.tool_choice"),
            ({"tools": "set_light"}, "response.tools"),
            ({"tools": [{"type": "mcp", "server_label": "x", "server_url": "http://x"}]}, "response.tools"),
        ):
            await connection.response.create(response=response)
            error = (await until(connection, "error"))[-1].error
            assert error.param == param, (response, error)


@pytest.mark.parametrize("tools", [[], [WEATHER_TOOL]], ids=["no_tools", "a_function"])
async def test_a_sessions_instructions_are_prefilled_before_its_first_response(
    conv_server: LiveServer, tools: list[dict[str, Any]]
) -> None:
    """New ``instructions`` (and the session's function tools, rendered as its responses render
    them) are evaluated by the LLM engine as the session is updated, into the slot its first
    response takes (``Conversation.prefill``): that response's usage reports them cached, where a
    session's first response evaluated them itself before."""
    instructions = f"Quillon{len(tools)} is your name. You answer every question in one short, friendly sentence."

    async def prefills() -> float:
        async with aiohttp.ClientSession() as http, http.get(f"{conv_server.url}/metrics") as resp:
            text = await resp.text()
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("mediaserver_llm_prefills_total")
        )

    initial = await prefills()
    async with sdk(conv_server).realtime.connect(model="gpt-realtime") as connection:
        await until(connection, "session.created")
        # The session's default instructions are prefilled at its creation: that one done first (read
        # after session.created, the count could still take it, and the response then raced the
        # update's prefill for the slot: the test failed so in every run of stop 62, on the old code too).
        async with asyncio.timeout(30):
            while await prefills() < initial + 1:  # (polled: no event says it)
                await asyncio.sleep(0.05)
        before = await prefills()
        await connection.session.update(session={**TEXT_ONLY, "instructions": instructions, "tools": tools})
        await until(connection, "session.updated")
        async with asyncio.timeout(30):
            while await prefills() <= before:  # the engine's answer to the prefill (polled: no event says it)
                await asyncio.sleep(0.05)
        await connection.conversation.item.create(
            item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": QUESTION}]}
        )
        await connection.response.create()
        usage = (await until(connection, "response.done"))[-1].response.usage
    details = usage.input_token_details
    assert details is not None and details.cached_tokens is not None
    # The instructions' ~20 tokens and the system turn's marks, and the tool's schema (~70 more).
    assert details.cached_tokens >= (60 if tools else 15), usage


async def test_realtime_max_items_forgets_the_oldest_items(server_factory: Callable[..., Any]) -> None:
    short: LiveServer = await server_factory(**VOICE_SETTINGS, realtime_max_items=2)
    async with sdk(short).realtime.connect(model="gpt-realtime") as connection:
        assert (await connection.recv()).type == "session.created"
        for item_id in ("item_one", "item_two", "item_three"):
            content = [{"type": "input_text", "text": f"note {item_id}"}]
            await connection.conversation.item.create(
                item={"id": item_id, "type": "message", "role": "user", "content": content}
            )
            await until(connection, "conversation.item.done")
        await connection.conversation.item.retrieve(item_id="item_two")
        assert (await until(connection, "conversation.item.retrieved"))[-1].item.id == "item_two"
        await connection.conversation.item.retrieve(item_id="item_one")  # the default (1000) keeps it
        error = (await until(connection, "error"))[-1]
        assert (error.error.code, error.error.param) == ("item_retrieve_invalid_item_id", "item_id"), error


async def test_sdk_audio_turn_is_heard_back(
    conv_server: LiveServer, asr_service: AsrService, speech: Callable[[str], Clip], wer: Any
) -> None:
    async with sdk(conv_server).realtime.connect(model="gpt-realtime") as connection:
        await until(connection, "session.created")
        await connection.session.update(
            session={"type": "realtime", "audio": {"input": {"turn_detection": None}, "output": {"voice": "alloy"}}}
        )
        await until(connection, "session.updated")
        for piece in chunks(pcm16(speech(QUESTION)), 2 * RATE // 5):
            await connection.input_audio_buffer.append(audio=base64.b64encode(piece).decode("ascii"))
        await connection.input_audio_buffer.commit()
        await connection.response.create()
        events = await until(connection, "response.done")
    kinds = [e.type for e in events]
    completed = next(e for e in events if e.type == "conversation.item.input_audio_transcription.completed")
    assert wer(QUESTION, completed.transcript) <= 0.2, completed.transcript
    assert kinds.index("conversation.item.input_audio_transcription.completed") < kinds.index(
        "response.output_item.added"
    )
    assert in_order(kinds, ANSWER_EVENTS_GA), kinds
    done = events[-1].response
    assert done.status == "completed" and done.audio.output.format.type == "audio/pcm"
    transcript = next(e for e in events if e.type == "response.output_audio_transcript.done").transcript
    deltas = "".join(e.delta for e in events if e.type == "response.output_audio_transcript.delta")
    assert transcript == deltas == done.output[0].content[0].transcript
    assert ANSWER_WORD in transcript.lower(), transcript
    audio = audio_of(events)
    assert audio.size > RATE  # more than a second of answer
    heard = await transcribe(asr_service, audio, RATE)
    assert wer(transcript, heard) <= 0.15, (transcript, heard)


async def test_sdk_server_vad_answers_by_itself(conv_server: LiveServer, speech: Callable[[str], Clip]) -> None:
    async with sdk(conv_server).realtime.connect(model="gpt-realtime") as connection:
        created = await until(connection, "session.created")
        turn = created[-1].session.audio.input.turn_detection
        assert turn.type == "server_vad" and turn.create_response is True and turn.interrupt_response is True
        for piece in chunks(pcm16(speech("What do bees make?"), silence_after_s=1.0), 2 * RATE // 10):
            await connection.input_audio_buffer.append(audio=base64.b64encode(piece).decode("ascii"))
        events = await until(connection, "response.done")
    kinds = [e.type for e in events]
    assert in_order(
        kinds,
        [
            "input_audio_buffer.speech_started",
            "input_audio_buffer.speech_stopped",
            "input_audio_buffer.committed",
            "conversation.item.added",
            "conversation.item.input_audio_transcription.completed",
            *ANSWER_EVENTS_GA,
        ],
    ), kinds
    user_item = next(e for e in events if e.type == "input_audio_buffer.committed").item_id
    answer_item = next(e for e in events if e.type == "response.output_item.added").item
    added = [e for e in events if e.type == "conversation.item.added"]
    assert added[-1].item.id == answer_item.id and added[-1].previous_item_id == user_item
    done = events[-1].response
    # The answer may reach the 60-token cap of VOICE_SETTINGS: that is "incomplete", as with OpenAI.
    assert done.status == "completed" or (done.status, done.status_details.reason) == (
        "incomplete",
        "max_output_tokens",
    )
    assert "honey" in done.output[0].content[0].transcript.lower()


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def paced_server(server_factory: Callable[..., Any]) -> LiveServer:
    # The default: answer audio at most realtime_audio_lead_ms (1 s) ahead of real time.
    server: LiveServer = await server_factory(**VOICE_SETTINGS)
    return server


async def test_sdk_interruption_cancels_and_truncate_trims(
    paced_server: LiveServer, llm_service: LlmService, speech: Callable[[str], Clip]
) -> None:
    async with sdk(paced_server).realtime.connect(model="gpt-realtime") as connection:
        await until(connection, "session.created")
        await connection.session.update(session={"type": "realtime", "instructions": "You tell long stories."})
        await until(connection, "session.updated")
        for piece in chunks(pcm16(speech(LONG_QUESTION), silence_after_s=1.0), 2 * RATE // 10):
            await connection.input_audio_buffer.append(audio=base64.b64encode(piece).decode("ascii"))
        before = await until(connection, "response.output_audio.delta")
        answer_id = next(e for e in before if e.type == "response.output_item.added").item.id
        for piece in chunks(pcm16(speech("Stop please."), silence_after_s=1.0), 2 * RATE // 10):
            await connection.input_audio_buffer.append(audio=base64.b64encode(piece).decode("ascii"))
        during = await until(connection, "response.done")
        events = before + during
        kinds = [e.type for e in during]
        # The user's speech cancels the answer; the events of the cancelled answer still close it.
        assert in_order(
            kinds,
            [
                "input_audio_buffer.speech_started",
                "response.output_audio.done",
                "response.output_audio_transcript.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.done",
            ],
        ), kinds
        done = during[-1].response
        assert (done.status, done.status_details.type, done.status_details.reason) == (
            "cancelled",
            "cancelled",
            "turn_detected",
        )
        deadline = time.monotonic() + 5  # the generation stops within a token (on the LLM's thread)
        while llm_busy(llm_service) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert not llm_busy(llm_service)
        written = "".join(e.delta for e in events if e.type == "response.output_audio_transcript.delta").split()
        sent = next(e for e in during if e.type == "response.output_audio_transcript.done").transcript.split()
        assert sent and sent == written[: len(sent)] and len(sent) < len(written), (sent, written)
        assert done.output[0].status == "incomplete" and done.output[0].content[0].transcript.split() == sent
        played_ms = round(audio_of(events).size / RATE * 1000)
        assert 0 < played_ms < 10_000  # at most what was sent: paced, not the whole story

        # The client played less than it got: truncate the answer to that.
        await connection.send(
            {
                "type": "conversation.item.truncate",
                "item_id": answer_id,
                "content_index": 0,
                "audio_end_ms": played_ms + 1000,
            }
        )
        error = (await until(connection, "error"))[-1]
        assert error.error.code == "invalid_value" and error.error.param == "audio_end_ms", error
        await connection.conversation.item.truncate(item_id=answer_id, content_index=0, audio_end_ms=300)
        truncated = (await until(connection, "conversation.item.truncated"))[-1]
        assert (truncated.item_id, truncated.audio_end_ms, truncated.content_index) == (answer_id, 300, 0)
        await connection.conversation.item.retrieve(item_id=answer_id)
        retrieved = (await until(connection, "conversation.item.retrieved"))[-1]
        kept = (retrieved.item.content[0].transcript or "").split()
        assert kept == sent[: len(kept)] and len(kept) < len(sent), (kept, sent)


# --- raw beta events over websockets ----------------------------------------------------------------------


class Raw:
    """A raw Realtime client over ``websockets``: JSON events out, every server event kept (and
    validated by the SDK's GA or beta models)."""

    def __init__(self, connection: Any, *, beta: bool) -> None:
        self.connection = connection
        self.events: list[dict[str, Any]] = []
        self.models = BETA_EVENTS if beta else GA_EVENTS

    async def send(self, event: dict[str, Any] | str) -> None:
        await self.connection.send(event if isinstance(event, str) else json.dumps(event))

    async def until(self, *kinds: str, timeout: float = 60.0) -> list[dict[str, Any]]:
        got: list[dict[str, Any]] = []
        async with asyncio.timeout(timeout):
            while True:
                event = json.loads(await self.connection.recv())
                self.models.validate_python(event)
                self.events.append(event)
                got.append(event)
                if event["type"] in kinds:
                    return got


@pytest_asyncio.fixture(loop_scope="session")
async def raw(conv_server: LiveServer) -> AsyncIterator[Callable[..., Any]]:
    opened: list[Any] = []

    async def open_raw(query: str = "?model=gpt-4o-realtime-preview", beta: bool = False, server: Any = None) -> Raw:
        target = server or conv_server
        headers = {"OpenAI-Beta": "realtime=v1"} if beta else {}
        connection = await websockets.connect(
            target.url.replace("http", "ws") + "/v1/realtime" + query, additional_headers=headers, max_size=None
        )
        opened.append(connection)
        return Raw(connection, beta=beta)

    yield open_raw
    for connection in opened:
        await connection.close()


def assert_error(event: dict[str, Any], code: str, param: str | None = None, event_id: str | None = None) -> None:
    assert event["type"] == "error", event
    error = event["error"]
    assert set(error) == ERROR_KEYS and error["message"], error
    assert (error["code"], error["param"], error["event_id"]) == (code, param, event_id), error


async def test_beta_client_text_then_g711_audio(raw: Callable[..., Any], asr_service: AsrService, wer: Any) -> None:
    from mediaserver.audio.stream_decode import ULAW_TO_PCM16

    client = await raw(beta=True)
    session = (await client.until("session.created"))[-1]["session"]
    assert session["object"] == "realtime.session" and session["model"] == "gpt-4o-realtime-preview"
    assert session["modalities"] == ["audio", "text"] and session["input_audio_format"] == "pcm16"
    assert session["output_audio_format"] == "pcm16" and session["turn_detection"]["create_response"] is True
    await client.send(
        {
            "type": "session.update",
            "session": {
                "modalities": ["text"],
                "instructions": VOICE_SETTINGS["assistant_system_prompt"],
                "voice": "alloy",
                "output_audio_format": "g711_ulaw",
                "turn_detection": None,
                "temperature": 0.0,
            },
        }
    )
    updated = (await client.until("session.updated"))[-1]["session"]
    assert (updated["modalities"], updated["output_audio_format"], updated["turn_detection"]) == (
        ["text"],
        "g711_ulaw",
        None,
    )
    user = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": QUESTION}]}
    await client.send({"type": "conversation.item.create", "item": user})
    created = (await client.until("conversation.item.created"))[-1]
    user_id = created["item"]["id"]
    await client.send({"type": "response.create"})
    events = await client.until("response.done")
    kinds = [e["type"] for e in events]
    assert in_order(
        kinds,
        [
            "response.created",
            "response.output_item.added",
            "conversation.item.created",
            "response.content_part.added",
            "response.text.delta",
            "response.text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.done",
        ],
    ), kinds
    assert not [k for k in kinds if k.startswith("response.output_") and "item" not in k]  # beta names only
    assert "conversation.item.added" not in kinds and "conversation.item.done" not in kinds
    done = events[-1]["response"]
    assert done["modalities"] == ["text"] and done["output"][0]["content"][0]["type"] == "text"
    assert ANSWER_WORD in done["output"][0]["content"][0]["text"].lower()

    # The next answer spoken, in G.711 μ-law at 8 kHz as the session asked.
    await client.send(
        {
            "type": "response.create",
            "response": {"modalities": ["audio", "text"], "instructions": "Answer in one short sentence."},
        }
    )
    events = await client.until("response.done")
    kinds = [e["type"] for e in events]
    assert "response.audio.delta" in kinds and "response.audio_transcript.delta" in kinds, kinds
    done = events[-1]["response"]
    assert done["status"] in ("completed", "incomplete") and done["output_audio_format"] == "g711_ulaw"
    transcript = next(e for e in events if e["type"] == "response.audio_transcript.done")["transcript"]
    ulaw = b"".join(base64.b64decode(e["delta"]) for e in events if e["type"] == "response.audio.delta")
    audio = ULAW_TO_PCM16[np.frombuffer(ulaw, np.uint8)].astype(np.float32) / 32768.0
    # Telephone audio (8 kHz, 8 bits): tiny.en hears it less well than 24 kHz PCM (in one CI run,
    # "consume grass" as "can soon grasp"), so the base model listens (it heard every word in 4 runs of 4).
    # (What it says is the model's: a new message after its own answer, as OpenAI's; until the engine
    # stopped continuing a last assistant message, this answer was the first one's continuation.)
    heard = await transcribe(asr_service, audio, 8000, model="base")
    assert transcript.strip() and wer(transcript, heard) <= 0.2, (transcript, heard)

    await client.send({"type": "conversation.item.delete", "item_id": user_id, "event_id": "del"})
    deleted = (await client.until("conversation.item.deleted"))[-1]
    assert deleted["item_id"] == user_id


@pytest.mark.parametrize("beta", [False, True])
async def test_the_session_echo_sent_back_changes_nothing(raw: Callable[..., Any], beta: bool) -> None:
    """The OpenAI SDKs send ``session.updated`` back as the next ``session.update``: the echo shows
    what runs (VOICE_SETTINGS' temperature 0 and 60-token answers, the VAD's 0.75), so sending it
    back changes nothing, twice over."""
    client = await raw(beta=beta)
    created = (await client.until("session.created"))[-1]["session"]
    if beta:
        assert (created["temperature"], created["max_response_output_tokens"]) == (0.0, 60)
        turn = created["turn_detection"]
    else:
        assert created["max_output_tokens"] == 60
        turn = created["audio"]["input"]["turn_detection"]
    assert (turn["threshold"], turn["silence_duration_ms"]) == (0.75, 500)
    assert "expires_at" not in created
    shown = created
    for _ in range(2):
        await client.send({"type": "session.update", "session": shown})
        updated = (await client.until("session.updated", "error"))[-1]
        assert updated["type"] == "session.updated", updated
        assert updated["session"] == created
        shown = updated["session"]


async def test_bad_input_is_an_error_event_and_the_session_stays(raw: Callable[..., Any]) -> None:
    client = await raw()
    await client.until("session.created")
    big = "A" * 20
    cases: list[tuple[dict[str, Any] | str, str, str | None]] = [
        ("not json", "invalid_json", None),
        ({"type": "response.nonsense"}, "invalid_value", "type"),
        ({"type": "input_audio_buffer.append", "audio": "@@not base64!"}, "invalid_value", "audio"),
        (
            {
                "type": "session.update",
                "session": {"audio": {"input": {"format": {"type": "audio/pcm", "rate": 44100}}}},
            },
            "invalid_value",
            "session.audio.input.format.rate",
        ),
        (
            {"type": "session.update", "session": {"audio": {"output": {"format": {"type": "audio/mp3"}}}}},
            "invalid_value",
            "session.audio.output.format.type",
        ),
        ({"type": "session.update", "session": {"type": "transcription"}}, "invalid_value", "session.type"),
        (
            {"type": "session.update", "session": {"audio": {"output": {"voice": "nobody-" + big}}}},
            "invalid_value",
            "session.audio.output.voice",
        ),
        (
            {"type": "session.update", "session": {"output_modalities": ["video"]}},
            "invalid_value",
            "session.output_modalities",
        ),
        ({"type": "conversation.item.create"}, "missing_required_parameter", "item"),
        ({"type": "conversation.item.create", "item": {"type": "image"}}, "invalid_value", "item.type"),
        (
            {"type": "conversation.item.create", "item": {"type": "function_call"}},
            "missing_required_parameter",
            "item.call_id",
        ),
        (
            {
                "type": "conversation.item.create",
                "item": {"type": "function_call_output", "call_id": "c", "output": ""},
            },
            "invalid_value",
            "item.call_id",
        ),
        (
            {
                "type": "conversation.item.create",
                "item": {"type": "message", "role": "user", "content": [{"type": "input_audio", "audio": "%%%"}]},
            },
            "invalid_value",
            "item.content[0].audio",
        ),
        (
            {"type": "conversation.item.truncate", "item_id": "item_nope", "content_index": 0, "audio_end_ms": 10},
            "item_truncate_invalid_item_id",
            "item_id",
        ),
        ({"type": "conversation.item.delete", "item_id": "item_nope"}, "item_delete_invalid_item_id", "item_id"),
        ({"type": "conversation.item.retrieve", "item_id": "item_nope"}, "item_retrieve_invalid_item_id", "item_id"),
        ({"type": "response.cancel"}, "response_cancel_not_active", None),
        (
            {"type": "response.create", "response": {"output_modalities": "text"}},
            "invalid_value",
            "response.output_modalities",
        ),
        ({"type": "output_audio_buffer.clear"}, "unsupported_event", "type"),
        # A lone UTF-16 surrogate: valid JSON, not text (it cancelled every later response of the session).
        (
            {
                "type": "conversation.item.create",
                "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi \ud800"}]},
            },
            "invalid_json",
            None,
        ),
        ({"type": "session.update", "session": {"instructions": "Be brief \udc00."}}, "invalid_json", None),
    ]
    for index, (event, code, param) in enumerate(cases):
        event_id = None if isinstance(event, str) else f"e{index}"
        await client.send(event if isinstance(event, str) else {**event, "event_id": event_id})
        assert_error((await client.until("error"))[-1], code, param, event_id)
    # A response in progress refuses a second one; then both end and the session still answers.
    await client.send({"type": "session.update", "session": TEXT_ONLY})
    await client.until("session.updated")
    user = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": QUESTION}]}
    await client.send({"type": "conversation.item.create", "item": user})
    await client.send({"type": "response.create", "event_id": "first"})
    await client.send({"type": "response.create", "event_id": "second"})
    events = await client.until("error")
    first = next(e for e in events if e["type"] == "response.created")["response"]["id"]
    assert_error(events[-1], "conversation_already_has_active_response", None, "second")
    assert first in events[-1]["error"]["message"]
    done = (await client.until("response.done"))[-1]["response"]
    assert done["id"] == first and done["status"] == "completed"
    assert ANSWER_WORD in done["output"][0]["content"][0]["text"].lower()


async def test_an_error_comes_after_the_replies_to_the_events_before_it(raw: Callable[..., Any]) -> None:
    """A trial's session.update then empty commit got the commit's error before session.updated
    (the update waits its turn on the session's worker; the error did not)."""
    client = await raw()
    await client.until("session.created")
    no_vad = {"type": "realtime", "audio": {"input": {"turn_detection": None}}}
    await client.send({"type": "session.update", "event_id": "u1", "session": no_vad})
    await client.send({"type": "input_audio_buffer.commit", "event_id": "c1"})
    await client.send("not json")  # (a review: parse errors still went first)
    await client.send({"type": "session.update", "event_id": "u2", "session": no_vad})
    await client.send({"type": "input_audio_buffer.commit", "event_id": "c2"})
    events: list[dict[str, Any]] = []
    while [e["type"] for e in events].count("error") < 3:
        events += await client.until("error")
    replies = [(e["type"], e["error"]["code"] if e["type"] == "error" else "") for e in events]
    replies = [reply for reply in replies if reply[0] in ("session.updated", "error")]
    assert replies == [
        ("session.updated", ""),
        ("error", "input_audio_buffer_commit_empty"),
        ("error", "invalid_json"),
        ("session.updated", ""),
        ("error", "input_audio_buffer_commit_empty"),
    ], replies


async def test_user_audio_item_is_transcribed_then_answered(
    raw: Callable[..., Any], conv_server: LiveServer, speech: Callable[[str], Clip], wer: Any
) -> None:
    client = await raw()
    await client.until("session.created")
    counted = conv_server.app[ASR].metrics.audio_seconds.labels("realtime")
    before = counted._value.get()
    audio = base64.b64encode(pcm16(speech(QUESTION))).decode("ascii")
    item = {"type": "message", "role": "user", "content": [{"type": "input_audio", "audio": audio}]}
    await client.send({"type": "conversation.item.create", "item": item})
    await client.send({"type": "response.create", "response": {"output_modalities": ["text"]}})
    events = await client.until("response.done")
    kinds = [e["type"] for e in events]
    added = next(e for e in events if e["type"] == "conversation.item.added")["item"]
    assert added["content"] == [{"type": "input_audio", "transcript": None}]
    completed = next(e for e in events if e["type"] == "conversation.item.input_audio_transcription.completed")
    assert completed["item_id"] == added["id"] and wer(QUESTION, completed["transcript"]) <= 0.2, completed
    # The response waited for the transcript before answering it.
    assert kinds.index("conversation.item.input_audio_transcription.completed") < kinds.index(
        "response.output_item.added"
    )
    assert ANSWER_WORD in events[-1]["response"]["output"][0]["content"][0]["text"].lower()
    # The item's audio counts as received audio, as the stream's does (a docs audit: it did not).
    assert counted._value.get() - before == pytest.approx(speech(QUESTION).audio16k.size / 16000, abs=0.05)


async def test_oversized_message_closes_with_a_reason(raw: Callable[..., Any]) -> None:
    client = await raw()
    await client.until("session.created")
    await client.send(json.dumps({"type": "input_audio_buffer.append", "audio": "A" * (24 * 1024 * 1024)}))
    with pytest.raises(websockets.ConnectionClosed) as closed:
        await client.until("never")
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009, closed.value
    assert closed.value.rcvd.reason.startswith("message too big: at most "), closed.value.rcvd.reason


async def test_hanging_up_mid_response_leaves_nothing_running(
    paced_server: LiveServer,
    raw: Callable[..., Any],
    llm_service: LlmService,
    tts_service: TtsService,
    speech: Callable[[str], Clip],
) -> None:
    client = await raw(server=paced_server)
    session_id = (await client.until("session.created"))[-1]["session"]["id"]
    await client.send({"type": "session.update", "session": {"instructions": "You tell long stories."}})
    user = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": LONG_QUESTION}]}
    await client.send({"type": "conversation.item.create", "item": user})
    await client.send({"type": "response.create"})
    await client.until("response.output_audio.delta")
    client.connection.transport.abort()  # no close frame: the TCP connection just goes away
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (
        session_id in paced_server.app[SESSIONS].ids() or llm_busy(llm_service) or tts_open_streams(tts_service)
    ):
        await asyncio.sleep(0.05)
    assert session_id not in paced_server.app[SESSIONS].ids()
    assert not llm_busy(llm_service)
    assert tts_open_streams(tts_service) == 0
    await tasks_ended(session_id)


async def test_without_tts_audio_is_a_clear_error_and_text_works(
    server_factory: Callable[..., Any], raw: Callable[..., Any]
) -> None:
    server: LiveServer = await server_factory(**VOICE_SETTINGS, tts_enabled=False)
    client = await raw(server=server)
    await client.until("session.created")
    user = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": QUESTION}]}
    await client.send({"type": "conversation.item.create", "item": user})
    await client.send({"type": "response.create", "event_id": "speak"})
    error = (await client.until("error"))[-1]
    assert_error(error, "feature_disabled", "session.output_modalities", "speak")
    assert "TTS is disabled" in error["error"]["message"] and "['text']" in error["error"]["message"]
    await client.send({"type": "response.create", "response": {"output_modalities": ["text"]}})
    done = (await client.until("response.done"))[-1]["response"]
    assert done["status"] == "completed" and ANSWER_WORD in done["output"][0]["content"][0]["text"].lower()
