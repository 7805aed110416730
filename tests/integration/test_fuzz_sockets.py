"""Fuzzing the socket protocols, seeded and bounded: random control JSON and binary frames on the
device WebSocket and on OpenAI Realtime (transcription and conversation sessions), and Wyoming
framing (bad header lines, lying lengths, non-UTF-8, wrong types, odd audio). Only documented
answers may come back (``error`` events with a documented code, never ``internal_error``), no
session is dropped for a client's mistake, nothing is logged at ERROR, and a well-formed request
right after succeeds."""

from __future__ import annotations

import asyncio
import json
import random
import string
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from mediaserver.asr.service import AsrService
from mediaserver.config import Settings
from mediaserver.state import SESSIONS
from mediaserver.transport.wyoming.framing import read_event
from mediaserver.transport.wyoming.server import WyomingServer
from mediaserver.tts.service import TtsService
from tests.conftest import SENTENCES, Clip, LiveServer
from tests.faults import server_errors
from tests.fuzzgen import control_messages, random_json

SEED = 1414
HOST = "127.0.0.1"
MARK = "END-OF-FUZZ"

# docs/ws-protocol.md: what the server sends, and the error codes that leave the session open.
WS_SERVER_TYPES = {"ready", "speech_started", "speech_stopped", "partial", "final", "pong", "error"}
WS_SERVER_TYPES |= {"assistant", "assistant_audio_started", "assistant_audio_stopped"}
WS_KEPT_CODES = {"invalid_message", "unknown_type", "not_started", "not_recording", "invalid_parameter"}
WS_KEPT_CODES |= {"model_not_found", "invalid_audio", "overloaded", "timeout", "model_unavailable"}
WS_KEPT_CODES |= {"unknown_call_id"}


# --- device WebSocket -----------------------------------------------------------------------------------


async def test_device_socket_fuzz(server: LiveServer, caplog: pytest.LogCaptureFixture) -> None:
    rng = random.Random(SEED)
    types = ["start", "stop", "clear", "ping", "interrupt", "reset", "hello", "final"]
    messages: list[str | bytes] = [*control_messages(rng, types, 250, obj_key=None)]
    # Client tools: starts with random tools / tool_choice, answers with random fields.
    for _ in range(40):
        tools = {"assistant": True, "tools": random_json(rng, 2), "tool_choice": random_json(rng, 1)}
        messages.append(json.dumps({"type": "start", **{k: v for k, v in tools.items() if rng.random() < 0.7}}))
        call_id = random_json(rng, 1) if rng.random() < 0.5 else f"call_{rng.randrange(1000)}"
        answer = {
            "call_id": call_id,
            "output": random_json(rng, 1),
            "is_error": rng.choice([False, random_json(rng, 1)]),
        }
        messages.append(json.dumps({"type": "tool_output", **{k: v for k, v in answer.items() if rng.random() < 0.7}}))
    # Binary frames: before and after starts, whole samples and not, random bytes (NaN and inf as float32).
    messages += [bytes(rng.randrange(256) for _ in range(rng.choice([0, 1, 3, 640, 641, 2048]))) for _ in range(60)]
    rng.shuffle(messages)
    received: list[dict[str, Any]] = []
    async with aiohttp.ClientSession() as http, http.ws_connect(f"{server.url}/api/ws/asr") as ws:
        for message in messages:
            await (ws.send_str(message) if isinstance(message, str) else ws.send_bytes(message))
        # A well-formed start right after, told apart by its prompt (ready echoes the configuration).
        await ws.send_json({"type": "start", "mode": "push_to_talk", "sample_rate": 16000, "prompt": MARK})
        while not (received and received[-1]["type"] == "ready" and received[-1]["prompt"] == MARK):
            msg = await ws.receive(timeout=60)
            assert msg.type == aiohttp.WSMsgType.TEXT, (msg.type, msg.data, ws.close_code)
            received.append(json.loads(msg.data))
        await ws.send_json({"type": "ping"})
        while (msg := await ws.receive_json(timeout=60))["type"] != "pong":
            received.append(msg)
        assert not ws.closed
    kinds = Counter(m["type"] for m in received)
    codes = Counter(m["code"] for m in received if m["type"] == "error")
    print(f"{len(messages)} device socket messages: answers {dict(kinds)}, errors {dict(codes)}")
    assert set(kinds) <= WS_SERVER_TYPES, kinds
    assert set(codes) <= WS_KEPT_CODES, codes  # never internal_error, never a close
    assert codes["invalid_message"] >= 10 and kinds["ready"] >= 5 and codes["unknown_call_id"] >= 1
    assert server_errors(caplog) == []


# --- OpenAI Realtime ------------------------------------------------------------------------------------


async def test_realtime_fuzz(server: LiveServer, caplog: pytest.LogCaptureFixture) -> None:
    rng = random.Random(SEED + 1)
    types = ["session.update", "transcription_session.update", "input_audio_buffer.append"]
    types += ["input_audio_buffer.commit", "input_audio_buffer.clear", "hello.world"]
    messages: list[str | bytes] = [*control_messages(rng, types, 200, obj_key=None)]
    messages += [bytes(rng.randrange(256) for _ in range(rng.randint(0, 50))) for _ in range(10)]
    rng.shuffle(messages)
    before = set(server.app[SESSIONS].ids())
    events: list[dict[str, Any]] = []
    async with (
        aiohttp.ClientSession() as http,
        http.ws_connect(f"{server.url}/v1/realtime?intent=transcription", max_msg_size=0) as ws,
    ):
        for message in messages:
            await (ws.send_str(message) if isinstance(message, str) else ws.send_bytes(message))
        # A well-formed update right after, told apart by its prompt (the updated session echoes it).
        mark = {"input_audio_transcription": {"model": "whisper-1", "prompt": MARK}}
        await ws.send_json({"type": "transcription_session.update", "session": mark})
        while not (events and events[-1]["type"].endswith(".updated") and MARK in json.dumps(events[-1])):
            msg = await ws.receive(timeout=60)
            assert msg.type == aiohttp.WSMsgType.TEXT, (msg.type, msg.data, ws.close_code)
            events.append(json.loads(msg.data))
            assert not (events[-1]["type"] == "error" and MARK in json.dumps(events[-1])), events[-1]
        assert len(set(server.app[SESSIONS].ids()) - before) == 1  # the session is still open
    kinds = Counter(e["type"] for e in events)
    errors = [e["error"] for e in events if e["type"] == "error"]
    print(f"{len(messages)} realtime events: answers {dict(kinds)}")
    assert len(errors) >= 50
    for error in errors:
        assert {"type", "code", "message"} <= set(error), error
        assert error["code"] != "internal_error", error
    assert server_errors(caplog) == []


async def test_realtime_conversation_fuzz(server: LiveServer, caplog: pytest.LogCaptureFixture) -> None:
    """The same on a Realtime conversation (items, responses, truncation, session.update of a
    conversation): error events for the client's mistakes, never a close, never internal_error."""
    rng = random.Random(SEED + 3)
    types = ["session.update", "conversation.item.create", "conversation.item.delete"]
    types += ["conversation.item.retrieve", "conversation.item.truncate", "response.create", "response.cancel"]
    types += ["output_audio_buffer.clear", "input_audio_buffer.append", "input_audio_buffer.commit", "hello.world"]
    messages: list[str | bytes] = [*control_messages(rng, types, 200, obj_key=None)]
    messages += [bytes(rng.randrange(256) for _ in range(rng.randint(0, 50))) for _ in range(10)]
    rng.shuffle(messages)
    before = set(server.app[SESSIONS].ids())
    events: list[dict[str, Any]] = []
    async with (
        aiohttp.ClientSession() as http,
        http.ws_connect(f"{server.url}/v1/realtime?model=gpt-realtime", max_msg_size=0) as ws,
    ):
        for message in messages:
            await (ws.send_str(message) if isinstance(message, str) else ws.send_bytes(message))
        await ws.send_json({"type": "session.update", "session": {"type": "realtime", "instructions": MARK}})
        while not (events and events[-1]["type"] == "session.updated" and MARK in json.dumps(events[-1])):
            msg = await ws.receive(timeout=120)
            assert msg.type == aiohttp.WSMsgType.TEXT, (msg.type, msg.data, ws.close_code)
            events.append(json.loads(msg.data))
            assert not (events[-1]["type"] == "error" and MARK in json.dumps(events[-1])), events[-1]
        assert len(set(server.app[SESSIONS].ids()) - before) == 1  # the session is still open
    kinds = Counter(e["type"] for e in events)
    errors = [e["error"] for e in events if e["type"] == "error"]
    print(f"{len(messages)} realtime conversation events: answers {dict(kinds)}")
    assert len(errors) >= 50
    for error in errors:
        assert {"type", "code", "message"} <= set(error), error
        assert error["code"] != "internal_error", error
    assert server_errors(caplog) == []


# --- Wyoming framing ------------------------------------------------------------------------------------

WYOMING_CODES = {"invalid_event", "event_too_large", "invalid_audio", "invalid_parameter", "model_not_found"}
WYOMING_CODES |= {"audio_too_large", "audio_buffer_full", "overloaded", "text_too_long", "voice_not_found"}
FMT = {"rate": 16000, "width": 2, "channels": 1}


def _event(kind: Any, data: Any = None, payload: bytes = b"", header: dict[str, Any] | None = None) -> bytes:
    head: dict[str, Any] = {"type": kind, **(header or {})}
    if data is not None:
        head["data"] = data
    if payload:
        head.setdefault("payload_length", len(payload))
    return json.dumps(head).encode() + b"\n" + payload


def wyoming_cases(rng: random.Random) -> list[tuple[str, bytes]]:
    cases: list[tuple[str, bytes]] = []
    weird: list[Any] = [None, -1, 0, 3, 1.5, "16000", True, 10**12, [], {}]
    for n in range(20):  # header lines that are not JSON objects, or not UTF-8
        line = bytes(rng.randrange(256) for _ in range(rng.randint(1, 80))).replace(b"\n", b"")
        cases.append((f"garbage header {n}", line + b"\n"))
    cases += [
        ("json list", b"[1, 2]\n"),
        ("json string", b'"describe"\n'),
        ("no type", b'{"data": {}}\n'),
        ("type not a string", b'{"type": 7}\n'),
        ("data not an object", b'{"type": "describe", "data": [1]}\n'),
        ("nested too deep", b'{"type": "describe", "data": ' + b"[" * 5000 + b"]" * 5000 + b"}\n"),
        ("header too long", b'{"type": "' + b"a" * 70000 + b'"}\n'),
        ("non-UTF-8 in a string", b'{"type": "describe\xff\xfe"}\n'),
    ]
    for key in ("data_length", "payload_length"):
        for value in [*weird, -(2**40), 2**40]:
            cases.append(
                (f"{key}={value!r}", json.dumps({"type": "audio-chunk", "data": FMT, key: value}).encode() + b"\n")
            )
        cases.append((f"{key} lies (more than sent)", _event("audio-chunk", FMT, header={key: 100}) + b"x" * 10))
    cases.append(("data block not JSON", _event("transcribe", header={"data_length": 5}) + b"\xff\xfe{]x"))
    cases.append(("data block a list", _event("transcribe", header={"data_length": 2}) + b"[]"))
    for n in range(25):  # ASR events with random fields
        kind = rng.choice(["transcribe", "audio-start", "audio-chunk", "audio-stop", "describe", "ping", "bogus"])
        data = {k: random_json(rng, 1) for k in rng.sample(["name", "language", "rate", "width", "channels"], 3)}
        payload = (
            bytes(rng.randrange(256) for _ in range(rng.choice([0, 1, 3, 1024]))) if kind == "audio-chunk" else b""
        )
        cases.append((f"{kind} with random fields {n}", _event(kind, data, payload)))
    for n in range(12):  # whole utterances in odd formats, some misaligned
        rate, width, channels = rng.choice([(16000, 2, 1), (8000, 2, 2), (44100, 4, 1), (22050, 1, 1), (16000, 2, 3)])
        chunks = b"".join(
            _event("audio-chunk", {"rate": rate, "width": width, "channels": channels}, bytes(rng.randint(1, 3000)))
            for _ in range(rng.randint(0, 4))
        )
        start = _event("audio-start", {"rate": rate, "width": width, "channels": channels})
        cases.append(
            (
                f"utterance {n} ({rate}/{width}/{channels})",
                _event("transcribe", {}) + start + chunks + _event("audio-stop"),
            )
        )
    cases += [  # speech out: refused before any synthesis starts
        ("synthesize without text", _event("synthesize", {})),
        ("synthesize text not a string", _event("synthesize", {"text": ["a"]})),
        ("synthesize voice not an object", _event("synthesize", {"text": "hi", "voice": "x"})),
        ("synthesize-chunk before start", _event("synthesize-chunk", {"text": "hi"})),
        ("synthesize-stop alone", _event("synthesize-stop", {})),
        ("synthesize-start twice", _event("synthesize-start", {}) + _event("synthesize-start", {})),
    ]
    for n in range(10):  # truncated valid streams
        full = (
            _event("transcribe", {"language": "en"})
            + _event("audio-start", FMT)
            + _event("audio-chunk", FMT, bytes(640))
        )
        cases.append((f"truncated at {n}", full[: rng.randrange(1, len(full))]))
    return cases


@pytest_asyncio.fixture(loop_scope="session")
async def wyoming_fuzz_server(
    base_settings: Settings, asr_service: AsrService, tts_service: TtsService
) -> AsyncIterator[WyomingServer]:
    settings = base_settings.model_copy(update={"wyoming_max_event_bytes": 256 * 1024})
    server = WyomingServer(settings, asr_service, tts=tts_service)
    await server.start(HOST, 0)
    yield server
    await server.aclose()


async def _exchange(port: int, data: bytes) -> list[tuple[str, dict[str, Any]]]:
    reader, writer = await asyncio.open_connection(HOST, port)
    try:
        writer.write(data)
        await writer.drain()
        writer.write_eof()
        raw = await asyncio.wait_for(reader.read(), timeout=30)
    except ConnectionError:
        raw = b""
    finally:
        writer.close()
    parsed = asyncio.StreamReader()
    parsed.feed_data(raw)
    parsed.feed_eof()
    events: list[tuple[str, dict[str, Any]]] = []
    while (event := await read_event(parsed, max_event_bytes=2**30)) is not None:
        events.append((event.type, event.data))
    return events


async def test_wyoming_framing_fuzz(
    wyoming_fuzz_server: WyomingServer,
    caplog: pytest.LogCaptureFixture,
    speech: Callable[[str], Clip],
    wer: Any,
) -> None:
    cases = wyoming_cases(random.Random(SEED + 2))
    assert 100 <= len(cases) <= 200
    port = wyoming_fuzz_server.port
    assert port is not None
    limit = asyncio.Semaphore(8)

    async def run(label: str, data: bytes) -> tuple[str, list[tuple[str, dict[str, Any]]]]:
        async with limit:
            return label, await _exchange(port, data)

    outcomes = await asyncio.gather(*(run(label, data) for label, data in cases))
    codes: Counter[str] = Counter()
    for label, events in outcomes:
        for kind, data in events:
            if kind == "error":
                codes[data.get("code", "?")] += 1
                assert data.get("code") in WYOMING_CODES, (label, data)
                assert isinstance(data.get("text"), str) and data["text"], (label, data)
            else:
                assert kind in (
                    "info",
                    "pong",
                    "transcript-start",
                    "transcript-chunk",
                    "transcript",
                    "transcript-stop",
                    "synthesize-stopped",
                )
    print(f"{len(cases)} Wyoming connections: errors {dict(codes)}")
    assert codes["invalid_event"] >= 20 and codes["invalid_audio"] >= 1
    async with asyncio.timeout(10):
        while wyoming_fuzz_server.connections:
            await asyncio.sleep(0.05)
    assert wyoming_fuzz_server.budget.used_bytes == 0
    # A real transcription right after.
    pcm = speech("kitchen").pcm16k_bytes
    utterance = _event("transcribe", {"language": "en"}) + _event("audio-start", FMT)
    utterance += b"".join(_event("audio-chunk", FMT, pcm[i : i + 2048]) for i in range(0, len(pcm), 2048))
    events = await _exchange(port, utterance + _event("audio-stop"))
    transcript = next(data for kind, data in events if kind == "transcript")
    assert wer(SENTENCES["kitchen"], transcript["text"]) <= 0.2
    assert server_errors(caplog) == []


def test_generators_are_deterministic() -> None:
    assert wyoming_cases(random.Random(SEED + 2)) == wyoming_cases(random.Random(SEED + 2))
    one = control_messages(random.Random(SEED), ["start"], 50, obj_key=None)
    assert one == control_messages(random.Random(SEED), ["start"], 50, obj_key=None)
    assert len(set(one)) > 30 and any(set(m) - set(string.printable) for m in one)


# --- a lone UTF-16 surrogate ("\ud800"): valid JSON, not text ---------------------------------------------------

SURROGATE_TEXT = "Turn on the \ud800 lights"  # json.dumps writes it as the escape \ud800


@pytest.mark.parametrize(
    ("kind", "data"),
    [
        ("synthesize", {"text": SURROGATE_TEXT}),
        ("synthesize-chunk", {"text": SURROGATE_TEXT}),
        ("transcribe", {"language": "en", "transcript_names": [SURROGATE_TEXT]}),
    ],
)
async def test_wyoming_text_with_a_lone_surrogate_is_an_invalid_event(
    wyoming_fuzz_server: WyomingServer, caplog: pytest.LogCaptureFixture, kind: str, data: dict[str, Any]
) -> None:
    """A trial's satellite text with a lone surrogate got ``internal_error`` (the TTS cache key and
    Whisper's tokenizer cannot encode it): it is the client's mistake, said as such."""
    port = wyoming_fuzz_server.port
    assert port is not None
    # The data in the header line, after it, or as UTF-8's bytes of a surrogate (a review: json.loads
    # takes those with "surrogatepass").
    for where in ("header", "data", "raw bytes"):
        if where == "header":
            events = await _exchange(port, _event(kind, data))
        else:
            body = json.dumps(data).encode()
            if where == "raw bytes":
                body = json.dumps(data, ensure_ascii=False).encode("utf-8", "surrogatepass")
            line = json.dumps({"type": kind, "data_length": len(body)}).encode() + b"\n"
            events = await _exchange(port, line + body)
        [(event, error)] = events
        assert event == "error" and error["code"] == "invalid_event", events
        assert ("UTF-8" if where == "raw bytes" else "surrogate") in error["text"], events
    assert server_errors(caplog) == []


async def test_the_device_socket_refuses_a_lone_surrogate_and_stays_open(
    server: LiveServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A start whose prompt held a lone surrogate was accepted, and its first utterance then closed
    the session with ``internal_error`` (Whisper's tokenizer), the words lost."""
    async with aiohttp.ClientSession() as http, http.ws_connect(f"{server.url}/api/ws/asr") as ws:
        for start in ({"type": "start", "prompt": SURROGATE_TEXT}, {"type": "start", "system_prompt": SURROGATE_TEXT}):
            await ws.send_str(json.dumps(start))
            error = await ws.receive_json(timeout=10)
            assert error["type"] == "error" and error["code"] == "invalid_message", error
            assert "surrogate" in error["message"], error
        await ws.send_str(json.dumps({"type": "start", "prompt": "Turn on the lights"}))
        assert (await ws.receive_json(timeout=10))["type"] == "ready"
    assert server_errors(caplog) == []
