"""OpenAI Realtime transcription sessions at /v1/realtime against the live server.

The official SDK's realtime client drives one session; the rest send the exact wire events over a
plain aiohttp WebSocket. Piper speech is resampled to 24 kHz PCM16 (or 16 kHz, or G.711 μ-law) and
base64'd into ``input_audio_buffer.append`` events, as a microphone client would send it.
"""

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
from openai.types.realtime import (
    ConversationItemInputAudioTranscriptionCompletedEvent,
    ConversationItemInputAudioTranscriptionDeltaEvent,
    InputAudioBufferCommittedEvent,
    SessionCreatedEvent,
    SessionUpdatedEvent,
)

from mediaserver.state import SESSIONS
from tests.conftest import SENTENCES, Clip, resample_to
from tests.faults import tasks_ended

RATE = 24000
ERROR_KEYS = {"type", "code", "message", "param", "event_id"}
TRANSCRIPTION_EVENTS = (
    "conversation.item.input_audio_transcription.delta",
    "conversation.item.input_audio_transcription.completed",
)


def pcm16(clip: Clip, rate_hz: int = RATE, silence_after_s: float = 0.0) -> bytes:
    audio = resample_to(clip, rate_hz)
    audio = np.concatenate([audio, np.zeros(int(silence_after_s * rate_hz), np.float32)])
    pcm: bytes = (np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes()
    return pcm


def ulaw(clip: Clip) -> bytes:
    """G.711 μ-law at 8 kHz (the classic segment encoder)."""
    samples = np.clip(np.round(resample_to(clip, 8000) * 32767), -32768, 32767).astype(np.int32)
    sign = np.where(samples < 0, 0x80, 0)
    magnitude = np.minimum(np.abs(samples), 32635) + 0x84
    exponent = np.clip(np.floor(np.log2(magnitude)).astype(np.int32) - 7, 0, 7)
    mantissa = (magnitude >> (exponent + 3)) & 0x0F
    encoded: bytes = (~(sign | (exponent << 4) | mantissa) & 0xFF).astype(np.uint8).tobytes()
    return encoded


def silence(seconds: float, rate_hz: int = RATE) -> bytes:
    return bytes(2 * int(seconds * rate_hz))


def append(data: bytes) -> dict[str, Any]:
    return {"type": "input_audio_buffer.append", "audio": base64.b64encode(data).decode("ascii")}


def chunks(data: bytes, chunk_bytes: int) -> list[bytes]:
    return [data[i : i + chunk_bytes] for i in range(0, len(data), chunk_bytes)]


class Client:
    """A raw Realtime client: JSON events out, every server event kept in arrival order."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.events: list[dict[str, Any]] = []
        self._queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._reader = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        async for msg in self.ws:
            if msg.type == aiohttp.WSMsgType.TEXT:
                event = json.loads(msg.data)
                self.events.append(event)
                self._queue.put_nowait(event)

    async def send(self, event: dict[str, Any]) -> None:
        await self.ws.send_str(json.dumps(event))

    async def send_raw(self, text: str) -> None:
        await self.ws.send_str(text)

    async def next(self, *kinds: str, timeout: float = 30.0) -> dict[str, Any]:
        """The next event of one of ``kinds`` (any event when none given), skipping others."""
        deadline = time.monotonic() + timeout
        while True:
            event = await asyncio.wait_for(self._queue.get(), timeout=max(0.01, deadline - time.monotonic()))
            if not kinds or event["type"] in kinds:
                return event

    async def stream(self, pcm: bytes, *, chunk_ms: int = 40, rate_hz: int = RATE, realtime: bool = False) -> None:
        """Append audio in ``chunk_ms`` pieces, paced like a microphone when ``realtime``."""
        started = time.monotonic()
        for index, piece in enumerate(chunks(pcm, 2 * rate_hz * chunk_ms // 1000)):
            await self.send(append(piece))
            if realtime:
                await asyncio.sleep(max(0.0, started + (index + 1) * chunk_ms / 1000 - time.monotonic()))

    async def close(self) -> None:
        await self.ws.close()
        self._reader.cancel()


@pytest_asyncio.fixture(loop_scope="session")
async def connect(server: Any) -> AsyncIterator[Callable[..., Any]]:
    sessions: list[aiohttp.ClientSession] = []
    clients: list[Client] = []

    async def open_client(
        target: Any = server, query: str = "?intent=transcription", headers: dict[str, str] | None = None
    ) -> Client:
        http = aiohttp.ClientSession()
        sessions.append(http)
        ws = await http.ws_connect(f"{target.url}/v1/realtime{query}", headers=headers, max_msg_size=0)
        client = Client(ws)
        clients.append(client)
        return client

    yield open_client
    for client in clients:
        await client.close()
    for http in sessions:
        await http.close()


async def configure(client: Client, session: dict[str, Any], kind: str = "session.update") -> dict[str, Any]:
    await client.send({"type": kind, "session": session})
    return await client.next(kind + "d", "error")


def manual(**input_audio: Any) -> dict[str, Any]:
    return {"type": "transcription", "audio": {"input": {"turn_detection": None, **input_audio}}}


def assert_error(event: dict[str, Any], code: str, param: str | None = None, event_id: str | None = None) -> None:
    assert event["type"] == "error", event
    assert isinstance(event["event_id"], str) and event["event_id"]
    error = event["error"]
    assert set(error) == ERROR_KEYS, error
    assert error["type"] == "invalid_request_error"
    assert error["code"] == code, error
    assert error["param"] == param, error
    assert error["event_id"] == event_id, error
    assert error["message"]


async def until_completed(client: Client, count: int = 1, timeout: float = 30.0) -> list[dict[str, Any]]:
    done: list[dict[str, Any]] = []
    while len(done) < count:
        done.append(await client.next("conversation.item.input_audio_transcription.completed", timeout=timeout))
    return done


def deltas_of(events: list[dict[str, Any]], item_id: str) -> list[str]:
    return [
        e["delta"]
        for e in events
        if e["type"] == "conversation.item.input_audio_transcription.delta" and e["item_id"] == item_id
    ]


async def test_session_created_and_server_vad_streaming_in_real_time(connect: Any, speech: Any, wer: Any) -> None:
    client = await connect()
    created = await client.next()
    assert created["type"] == "session.created"
    session = created["session"]
    assert session["type"] == "transcription" and session["id"].startswith("sess_")
    assert session["object"] == "realtime.transcription_session"
    audio_input = session["audio"]["input"]
    assert audio_input["format"] == {"type": "audio/pcm", "rate": 24000}
    assert audio_input["turn_detection"] == {  # what runs: stream_vad_aggressiveness 3 is threshold 0.75
        "type": "server_vad",
        "threshold": 0.75,
        "prefix_padding_ms": 300,
        "silence_duration_ms": 500,
    }
    assert set(audio_input["transcription"]) == {"model", "language", "prompt"}
    updated = await configure(
        client,
        {"type": "transcription", "audio": {"input": {"transcription": {"model": "whisper-1", "language": "en"}}}},
    )
    assert updated["type"] == "session.updated", updated
    assert updated["session"]["audio"]["input"]["transcription"]["model"] == "whisper-1"

    clip = speech("The old lighthouse keeper walked slowly along the rocky shore, and the seagulls followed him home.")
    await client.stream(pcm16(clip, silence_after_s=1.0), realtime=True)
    (completed,) = await until_completed(client)
    item_id = completed["item_id"]
    kinds = [e["type"] for e in client.events]
    order = [
        "input_audio_buffer.speech_started",
        "input_audio_buffer.speech_stopped",
        "input_audio_buffer.committed",
        "conversation.item.added",
        "conversation.item.done",
        "conversation.item.input_audio_transcription.completed",
    ]
    positions = [kinds.index(kind) for kind in order]
    assert positions == sorted(positions), kinds
    by_type = {e["type"]: e for e in client.events}
    assert by_type["input_audio_buffer.speech_started"]["item_id"] == item_id
    assert by_type["input_audio_buffer.speech_stopped"]["item_id"] == item_id
    assert by_type["input_audio_buffer.committed"] == {
        "type": "input_audio_buffer.committed",
        "event_id": by_type["input_audio_buffer.committed"]["event_id"],
        "previous_item_id": None,
        "item_id": item_id,
    }
    item = by_type["conversation.item.added"]["item"]
    assert item["id"] == item_id and item["role"] == "user" and item["type"] == "message"
    assert item["content"] == [{"type": "input_audio", "transcript": None}]
    start_ms = by_type["input_audio_buffer.speech_started"]["audio_start_ms"]
    end_ms = by_type["input_audio_buffer.speech_stopped"]["audio_end_ms"]
    assert 0 <= start_ms < 600 and end_ms > start_ms + 3000, (start_ms, end_ms)

    deltas = deltas_of(client.events, item_id)
    assert deltas, kinds
    assert all(
        e["content_index"] == 0
        for e in client.events
        if e["type"] == "conversation.item.input_audio_transcription.delta"
    )
    assert "".join(deltas) == completed["transcript"]  # append-only deltas add up to the transcript
    assert wer(clip.text, completed["transcript"]) <= 0.2, completed
    assert completed["content_index"] == 0
    assert completed["usage"]["type"] == "duration" and completed["usage"]["seconds"] > 3
    event_ids = [e["event_id"] for e in client.events]
    assert len(set(event_ids)) == len(event_ids)


async def test_openai_sdk_realtime_client(server: Any, speech: Any, wer: Any) -> None:
    client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    clip = speech("kitchen")
    async with client.realtime.connect(extra_query={"intent": "transcription"}) as connection:
        created = await connection.recv()
        assert isinstance(created, SessionCreatedEvent)
        await connection.session.update(
            session={
                "type": "transcription",
                "audio": {
                    "input": {
                        "format": {"type": "audio/pcm", "rate": 24000},
                        "transcription": {"model": "gpt-4o-transcribe", "language": "en"},
                        "turn_detection": {"type": "server_vad", "silence_duration_ms": 500},
                    }
                },
            }
        )
        for piece in chunks(pcm16(clip, silence_after_s=1.0), 2 * RATE // 10):
            await connection.input_audio_buffer.append(audio=base64.b64encode(piece).decode("ascii"))
        received: list[Any] = []
        async with asyncio.timeout(30):
            async for event in connection:
                received.append(event)
                if isinstance(event, ConversationItemInputAudioTranscriptionCompletedEvent):
                    break
    kinds = [e.type for e in received]
    assert isinstance(received[0], SessionUpdatedEvent), kinds
    committed = next(e for e in received if isinstance(e, InputAudioBufferCommittedEvent))
    completed = received[-1]
    assert isinstance(completed, ConversationItemInputAudioTranscriptionCompletedEvent)
    assert completed.item_id == committed.item_id
    deltas = [e.delta or "" for e in received if isinstance(e, ConversationItemInputAudioTranscriptionDeltaEvent)]
    assert "".join(deltas) == completed.transcript
    assert wer(SENTENCES["kitchen"], completed.transcript) <= 0.2, completed


async def test_two_utterances_become_two_items_in_order(connect: Any, speech: Any, wer: Any) -> None:
    client = await connect()
    await client.next("session.created")
    first, second = speech("weather"), speech("remind")
    await client.stream(pcm16(first, silence_after_s=1.0) + pcm16(second, silence_after_s=1.0), chunk_ms=100)
    completed = await until_completed(client, 2)
    committed = [e for e in client.events if e["type"] == "input_audio_buffer.committed"]
    started = [e for e in client.events if e["type"] == "input_audio_buffer.speech_started"]
    assert [c["item_id"] for c in committed] == [c["item_id"] for c in completed] == [s["item_id"] for s in started]
    assert committed[0]["previous_item_id"] is None
    assert committed[1]["previous_item_id"] == committed[0]["item_id"]
    assert started[0]["audio_start_ms"] < started[1]["audio_start_ms"]
    for clip, done in zip((first, second), completed, strict=True):
        assert wer(clip.text, done["transcript"]) <= 0.2, done
        assert "".join(deltas_of(client.events, done["item_id"])) == done["transcript"]


async def test_manual_commit_clear_and_empty_commit(connect: Any, speech: Any, wer: Any) -> None:
    client = await connect()
    await client.next("session.created")
    updated = await configure(client, manual())
    assert updated["type"] == "session.updated" and updated["session"]["audio"]["input"]["turn_detection"] is None
    clip = speech("garden")
    await client.stream(pcm16(clip), chunk_ms=200)
    await client.send({"type": "input_audio_buffer.commit", "event_id": "evt_commit"})
    (completed,) = await until_completed(client)
    kinds = [e["type"] for e in client.events]
    assert "input_audio_buffer.speech_started" not in kinds
    committed = next(e for e in client.events if e["type"] == "input_audio_buffer.committed")
    assert committed["item_id"] == completed["item_id"] and committed["previous_item_id"] is None
    assert deltas_of(client.events, completed["item_id"]) == [completed["transcript"]]
    assert wer(SENTENCES["garden"], completed["transcript"]) <= 0.2, completed

    await client.stream(pcm16(speech("music")), chunk_ms=200)
    await client.send({"type": "input_audio_buffer.clear"})
    assert (await client.next())["type"] == "input_audio_buffer.cleared"
    await client.send({"type": "input_audio_buffer.commit", "event_id": "evt_empty"})
    assert_error(await client.next(), "input_audio_buffer_commit_empty", event_id="evt_empty")

    # The session still works: a second item follows the first.
    await client.stream(pcm16(speech("kitchen")), chunk_ms=200)
    await client.send({"type": "input_audio_buffer.commit"})
    (second,) = await until_completed(client)
    second_commit = [e for e in client.events if e["type"] == "input_audio_buffer.committed"][-1]
    assert second_commit["previous_item_id"] == completed["item_id"]
    assert wer(SENTENCES["kitchen"], second["transcript"]) <= 0.2, second


async def test_include_logprobs_adds_the_words_logprobs_to_the_transcription(
    connect: Any, speech: Any, wer: Any
) -> None:
    """``include: ["item.input_audio_transcription.logprobs"]`` is echoed and acted on: the completed
    transcription carries ``logprobs`` (OpenAI's shape: token, logprob, bytes; here one entry per
    Whisper word, its probability's natural log). A Realtime trial found it echoed and ignored.
    Without it there is no ``logprobs`` field."""
    client = await connect()
    await client.next("session.created")
    for include in (["item.input_audio_transcription.logprobs"], None):
        updated = await configure(client, {**manual(), "include": include})
        assert updated["session"]["include"] == include, updated
        await client.stream(pcm16(speech("garden")), chunk_ms=200)
        await client.send({"type": "input_audio_buffer.commit"})
        (completed,) = await until_completed(client)
        assert wer(SENTENCES["garden"], completed["transcript"]) <= 0.2, completed
        if include is None:
            assert "logprobs" not in completed, completed
            continue
        logprobs = completed["logprobs"]
        assert len(logprobs) >= 8, logprobs  # "My neighbor planted tomatoes and beans in her small garden."
        assert all(set(e) == {"token", "logprob", "bytes"} and e["logprob"] <= 0 for e in logprobs), logprobs
        assert all(bytes(e["bytes"]).decode("utf-8") == e["token"] for e in logprobs), logprobs
        assert wer(SENTENCES["garden"], "".join(e["token"] for e in logprobs)) <= 0.2, logprobs


async def test_turn_detection_changes_keep_one_session_clock(connect: Any, speech: Any, wer: Any) -> None:
    client = await connect()
    await client.next("session.created")
    vad = {"type": "server_vad", "threshold": 0.6, "prefix_padding_ms": 200, "silence_duration_ms": 700}
    updated = await configure(client, {"type": "transcription", "audio": {"input": {"turn_detection": vad}}})
    # 0.6 runs as webrtcvad's aggressiveness 2, whose level the echo shows.
    assert updated["session"]["audio"]["input"]["turn_detection"] == {**vad, "threshold": 0.5}
    await client.stream(pcm16(speech("weather"), silence_after_s=1.0), chunk_ms=100)
    (first,) = await until_completed(client)
    # Speech still going when turn detection is switched off: that utterance is finished first.
    await client.stream(pcm16(speech("kitchen")), chunk_ms=100)
    updated = await configure(client, manual())
    assert updated["session"]["audio"]["input"]["turn_detection"] is None
    kinds = [e["type"] for e in client.events]
    assert kinds.count("conversation.item.input_audio_transcription.completed") == 2, kinds
    second = [e for e in client.events if e["type"] == TRANSCRIPTION_EVENTS[1]][-1]
    assert wer(SENTENCES["kitchen"], second["transcript"]) <= 0.25, second
    # semantic_vad: the turn model ends the turn; the session clock continues across the changes.
    semantic = {"type": "semantic_vad", "eagerness": "high"}
    updated = await configure(client, {"type": "transcription", "audio": {"input": {"turn_detection": semantic}}})
    assert updated["session"]["audio"]["input"]["turn_detection"]["type"] == "semantic_vad"
    await client.stream(pcm16(speech("remind"), silence_after_s=1.0), chunk_ms=100)
    (third,) = await until_completed(client)
    assert wer(SENTENCES["remind"], third["transcript"]) <= 0.2, third
    started = [e["audio_start_ms"] for e in client.events if e["type"] == "input_audio_buffer.speech_started"]
    assert len(started) == 3 and started == sorted(started), started
    committed = [e for e in client.events if e["type"] == "input_audio_buffer.committed"]
    assert [c["item_id"] for c in committed] == [first["item_id"], second["item_id"], third["item_id"]]
    assert [c["previous_item_id"] for c in committed] == [None, first["item_id"], second["item_id"]]


@pytest.mark.parametrize(
    "turn_detection",
    [
        {"type": "server_vad", "threshold": 0.6, "silence_duration_ms": 20},
        {"type": "semantic_vad", "eagerness": "low"},
    ],
)
async def test_the_session_echo_sent_back_changes_nothing(connect: Any, turn_detection: dict[str, Any]) -> None:
    """A transcription session's ``session.updated`` sent back as the next update is shown again
    unchanged: it names what runs (0.6 runs as the 0.5 level, 20 ms of silence as 60)."""
    client = await connect()
    await client.next("session.created")
    first = await configure(client, {"type": "transcription", "audio": {"input": {"turn_detection": turn_detection}}})
    assert first["type"] == "session.updated", first
    shown = first["session"]["audio"]["input"]["turn_detection"]
    if turn_detection["type"] == "server_vad":
        assert (shown["threshold"], shown["silence_duration_ms"]) == (0.5, 60)
    else:
        assert shown["eagerness"] == "low" and "silence_duration_ms" not in shown
    again = await configure(client, first["session"])
    assert again["type"] == "session.updated", again
    assert again["session"] == first["session"]


async def test_16khz_pcm_extension(connect: Any, speech: Any, wer: Any) -> None:
    client = await connect()
    await client.next("session.created")
    updated = await configure(client, manual(format={"type": "audio/pcm", "rate": 16000}))
    assert updated["session"]["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 16000}
    await client.stream(speech("story").pcm16k_bytes, chunk_ms=200, rate_hz=16000)
    await client.send({"type": "input_audio_buffer.commit"})
    (completed,) = await until_completed(client)
    assert wer(SENTENCES["story"], completed["transcript"]) <= 0.2, completed


async def test_beta_client_with_g711_ulaw(connect: Any, speech: Any, wer: Any) -> None:
    client = await connect(query="?model=gpt-4o-transcribe", headers={"OpenAI-Beta": "realtime=v1"})
    assert (await client.next())["type"] == "session.created"
    assert (await client.next())["type"] == "transcription_session.created"
    updated = await configure(
        client,
        {
            "input_audio_format": "g711_ulaw",
            "input_audio_transcription": {"model": "whisper-1", "language": "en", "prompt": ""},
            "turn_detection": None,
        },
        kind="transcription_session.update",
    )
    assert updated["type"] == "transcription_session.updated", updated
    assert updated["session"]["input_audio_format"] == "g711_ulaw"
    assert updated["session"]["turn_detection"] is None
    await client.send(append(ulaw(speech("weather"))))
    await client.send({"type": "input_audio_buffer.commit"})
    (completed,) = await until_completed(client)
    kinds = [e["type"] for e in client.events]
    assert "conversation.item.created" in kinds and "conversation.item.added" not in kinds
    assert wer(SENTENCES["weather"], completed["transcript"]) <= 0.2, completed


async def test_bad_events_are_error_events_and_the_session_survives(connect: Any, speech: Any, wer: Any) -> None:
    client = await connect()
    await client.next("session.created")
    cases: list[tuple[str | bytes | dict[str, Any], str, str | None]] = [
        ("not json", "invalid_json", None),
        ("[1, 2]", "invalid_json", None),
        ("[" * 100_000, "invalid_json", None),
        (b"\x00\x01", "invalid_type", None),
        ({"event_id": "e1"}, "missing_required_parameter", "type"),
        ({"type": "nope.nothing", "event_id": "e2"}, "invalid_value", "type"),
        ({"type": "response.create", "event_id": "e3"}, "unsupported_event", "type"),
        ({"type": "input_audio_buffer.append", "event_id": "e4"}, "missing_required_parameter", "audio"),
        ({"type": "input_audio_buffer.append", "audio": "@@not base64!", "event_id": "e5"}, "invalid_value", "audio"),
        (
            {
                "type": "session.update",
                "event_id": "e6",
                "session": manual(format={"type": "audio/pcm", "rate": 44100}),
            },
            "invalid_value",
            "session.audio.input.format.rate",
        ),
        (
            {
                "type": "session.update",
                "event_id": "e7",
                "session": {"audio": {"input": {"transcription": {"language": "klingon"}}}},
            },
            "invalid_value",
            "session.audio.input.transcription.language",
        ),
        (
            {
                "type": "session.update",
                "event_id": "e8",
                # tiny.en, named, is English-only
                "session": {"audio": {"input": {"transcription": {"model": "tiny.en", "language": "de"}}}},
            },
            "invalid_value",
            "session.audio.input.transcription.language",
        ),
        (
            {
                "type": "session.update",
                "event_id": "e9",
                "session": {"audio": {"input": {"transcription": {"model": "no-such-model"}}}},
            },
            "model_not_found",
            "session.audio.input.transcription.model",
        ),
        (
            {"type": "session.update", "event_id": "e10", "session": {"type": "realtime"}},
            "invalid_value",
            "session.type",
        ),
        (
            {"type": "session.update", "event_id": "e11", "session": {"turn_detection": {"threshold": 2}}},
            "invalid_value",
            "session.turn_detection.threshold",
        ),
        (
            {"type": "transcription_session.update", "event_id": "e12", "session": {"input_audio_format": "mp3"}},
            "invalid_value",
            "session.input_audio_format",
        ),
    ]
    for raw, code, param in cases:
        if isinstance(raw, bytes):
            await client.ws.send_bytes(raw)
        elif isinstance(raw, str):
            await client.send_raw(raw)
        else:
            await client.send(raw)
        event_id = raw.get("event_id") if isinstance(raw, dict) else None
        assert_error(await client.next(), code, param, event_id)
    # Nothing was applied: the session is still 24 kHz PCM, English, server VAD.
    updated = await configure(client, {})
    audio_input = updated["session"]["audio"]["input"]
    assert audio_input["format"]["rate"] == 24000 and audio_input["transcription"]["language"] == "en"
    assert audio_input["turn_detection"]["type"] == "server_vad"
    await client.stream(pcm16(speech("music"), silence_after_s=1.0), chunk_ms=100)
    (completed,) = await until_completed(client)
    assert wer(SENTENCES["music"], completed["transcript"]) <= 0.25, completed


async def test_oversize_append_is_an_error_event(connect: Any) -> None:
    client = await connect()
    await client.next("session.created")
    await client.send({**append(bytes(15 * 1024 * 1024 + 30_000)), "event_id": "big"})
    assert_error(await client.next(), "audio_too_large", "audio", "big")
    assert (await configure(client, {}))["type"] == "session.updated"


async def test_abrupt_disconnect_mid_utterance_leaves_nothing_behind(server: Any, speech: Any) -> None:
    sessions = server.app[SESSIONS]
    connection = await websockets.connect(server.url.replace("http", "ws") + "/v1/realtime?intent=transcription")
    created = json.loads(await connection.recv())
    session_id = created["session"]["id"]
    assert session_id in sessions.ids()
    pcm = pcm16(speech("story"))
    started = time.monotonic()
    for index, piece in enumerate(chunks(pcm[: 2 * RATE * 2], 2 * RATE // 25)):  # 2 s of speech, no silence
        await connection.send(json.dumps(append(piece)))
        await asyncio.sleep(max(0.0, started + (index + 1) * 0.04 - time.monotonic()))
    while json.loads(await connection.recv())["type"] != "input_audio_buffer.speech_started":
        pass
    connection.transport.abort()  # no close frame: the TCP connection just goes away
    deadline = time.monotonic() + 10
    while session_id in sessions.ids() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert session_id not in sessions.ids()
    await tasks_ended(session_id)


async def test_auth_idle_timeout_and_plain_get(server_factory: Any, speech: Any) -> None:
    guarded = await server_factory(api_keys=["sekret"], ws_idle_timeout_s=1.0)
    client = openai.AsyncOpenAI(base_url=guarded.url + "/v1", api_key="sekret", max_retries=0)
    async with client.realtime.connect(model="gpt-realtime") as connection:
        assert isinstance(await connection.recv(), SessionCreatedEvent)
    async with aiohttp.ClientSession() as http:
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await http.ws_connect(f"{guarded.url}/v1/realtime")
        assert refused.value.status == 401
        async with http.get(f"{guarded.url}/v1/realtime", headers={"Authorization": "Bearer sekret"}) as plain:
            assert plain.status == 426
            assert (await plain.json())["error"]["code"] == "upgrade_required"
        async with http.ws_connect(f"{guarded.url}/v1/realtime", headers={"Authorization": "Bearer sekret"}) as idle:
            first = await idle.receive_json(timeout=5)
            assert first["type"] == "session.created"
            error = await idle.receive_json(timeout=5)
            assert error["type"] == "error" and error["error"]["code"] == "idle_timeout"
            closing = await idle.receive(timeout=5)
            assert closing.type == aiohttp.WSMsgType.CLOSE and idle.close_code == 4408
