"""The Wyoming ASR server as Home Assistant uses it: the ``wyoming`` package's own client, a new TCP
connection per utterance, real Piper speech and the shared Whisper models; plus raw sockets for
everything a well-behaved client would never send."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import types
from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np
import pytest
import pytest_asyncio
from aiohttp import web
from wyoming.asr import Transcribe, Transcript
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.event import Event, Eventable
from wyoming.info import Describe, Info
from wyoming.ping import Ping, Pong

from mediaserver.asr.service import AsrService
from mediaserver.config import Settings
from mediaserver.languages import WHISPER_LANGUAGES
from mediaserver.state import ASR, SETTINGS
from mediaserver.transport.wyoming.server import WYOMING_PORT, WyomingServer, wyoming_ctx
from tests.conftest import SENTENCES, Clip, noise

HOST = "127.0.0.1"
CHUNK_SAMPLES = 1024  # what the tests send per audio-chunk, as Home Assistant's stream does
MAX_EVENT_BYTES = 64 * 1024


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def wyoming(base_settings: Settings, asr_service: AsrService) -> AsyncIterator[WyomingServer]:
    settings = base_settings.model_copy(update={"wyoming_max_event_bytes": MAX_EVENT_BYTES})
    server = WyomingServer(settings, asr_service)
    await server.start(HOST, 0)
    yield server
    await server.aclose()


def port_of(server: WyomingServer) -> int:
    assert server.port is not None
    return server.port


def pcm_chunks(pcm: bytes, rate: int, width: int = 2, channels: int = 1) -> list[Event]:
    step = CHUNK_SAMPLES * width * channels
    return [
        AudioChunk(rate=rate, width=width, channels=channels, audio=pcm[i : i + step]).event()
        for i in range(0, len(pcm), step)
    ]


async def read_until(client: AsyncTcpClient, last_type: str) -> list[Event]:
    events: list[Event] = []
    while True:
        event = await asyncio.wait_for(client.read_event(), timeout=60)
        assert event is not None, f"connection closed before {last_type}; got {[e.type for e in events]}"
        events.append(event)
        if event.type in (last_type, "error"):
            return events


async def home_assistant_stt(
    port: int, pcm16k: bytes, language: str | None, *, name: str | None = None
) -> tuple[str, list[Event]]:
    """Home Assistant's wyoming/stt.py, step by step: one connection, read events until transcript."""
    client = AsyncTcpClient(HOST, port)
    await client.connect()
    try:
        await client.write_event(Transcribe(name=name, language=language).event())
        await client.write_event(AudioStart(rate=16000, width=2, channels=1).event())
        for chunk in pcm_chunks(pcm16k, 16000):
            await client.write_event(chunk)
        await client.write_event(AudioStop().event())
        events = await read_until(client, "transcript")
    finally:
        await client.disconnect()
    assert events[-1].type == "transcript", events[-1]
    return Transcript.from_event(events[-1]).text, events


@pytest.mark.parametrize("key", ["kitchen", "weather", "remind"])
async def test_home_assistant_stt(wyoming: WyomingServer, speech: Callable[[str], Clip], wer: Any, key: str) -> None:
    text, _ = await home_assistant_stt(port_of(wyoming), speech(key).pcm16k_bytes, "en")
    assert wer(SENTENCES[key], text) <= 0.15, text


@pytest.mark.parametrize(("language", "name"), [("en-US", None), ("en", "base"), ("en", "tiny.en")])
async def test_language_tags_and_model_names(
    wyoming: WyomingServer, speech: Callable[[str], Clip], wer: Any, language: str, name: str | None
) -> None:
    text, events = await home_assistant_stt(port_of(wyoming), speech("music").pcm16k_bytes, language, name=name)
    assert wer(SENTENCES["music"], text) <= 0.15, text
    assert Transcript.from_event(events[-1]).language == "en"


async def test_home_assistant_in_another_language_gets_the_multilingual_model(
    wyoming: WyomingServer, speech: Callable[[str], Clip]
) -> None:
    """Home Assistant sends its pipeline's language and never a model name: with the English-only
    default (tiny.en) a German pipeline was refused at every request; translation_model (base)
    transcribes it."""
    for name in (None, "whisper-1"):  # an OpenAI name names no model of ours either
        text, events = await home_assistant_stt(port_of(wyoming), speech("music").pcm16k_bytes, "de", name=name)
        assert text.strip() and Transcript.from_event(events[-1]).language == "de", (name, events)


async def test_audio_without_transcribe_uses_the_defaults(
    wyoming: WyomingServer, speech: Callable[[str], Clip], wer: Any
) -> None:
    client = AsyncTcpClient(HOST, port_of(wyoming))
    await client.connect()
    try:
        await client.write_event(AudioStart(rate=16000, width=2, channels=1).event())
        for chunk in pcm_chunks(speech("garden").pcm16k_bytes, 16000):
            await client.write_event(chunk)
        await client.write_event(AudioStop().event())
        events = await read_until(client, "transcript-stop")
    finally:
        await client.disconnect()
    transcript = Transcript.from_event(next(e for e in events if e.type == "transcript"))
    assert transcript.language == "en"
    assert wer(SENTENCES["garden"], transcript.text) <= 0.15, transcript.text


async def test_describe_lists_models_and_languages(wyoming: WyomingServer) -> None:
    client = AsyncTcpClient(HOST, port_of(wyoming))
    await client.connect()
    try:
        await client.write_event(Describe().event())
        event = await asyncio.wait_for(client.read_event(), timeout=10)
        await client.write_event(Ping(text="hello").event())
        pong = await asyncio.wait_for(client.read_event(), timeout=10)
    finally:
        await client.disconnect()
    assert event is not None and Info.is_type(event.type)
    info = Info.from_event(event)
    assert len(info.asr) == 1
    program = info.asr[0]
    assert program.name == "mediaserver"
    assert program.installed and program.version and program.attribution.url
    assert program.supports_transcript_streaming is True
    models = {m.name: m for m in program.models}
    assert {"tiny.en", "base"} <= set(models)
    assert models["tiny.en"].languages == ["en"]
    # Every Whisper language but Cantonese, which came with large-v3 (a user trial: 'yue' was listed).
    assert models["base"].languages == [code for code in WHISPER_LANGUAGES if code != "yue"]
    assert all(m.installed and m.attribution.name and m.version for m in program.models)
    assert pong is not None and Pong.is_type(pong.type) and Pong.from_event(pong).text == "hello"


async def test_streaming_events_in_order(wyoming: WyomingServer, speech: Callable[[str], Clip], wer: Any) -> None:
    client = AsyncTcpClient(HOST, port_of(wyoming))
    await client.connect()
    try:
        await client.write_event(Transcribe(language="en").event())
        await client.write_event(AudioStart(rate=16000, width=2, channels=1).event())
        for chunk in pcm_chunks(speech("story").pcm16k_bytes, 16000):
            await client.write_event(chunk)
        await client.write_event(AudioStop().event())
        events = await read_until(client, "transcript-stop")
    finally:
        await client.disconnect()
    types_seen = [e.type for e in events]
    assert types_seen[0] == "transcript-start"
    assert types_seen[-2:] == ["transcript", "transcript-stop"]
    assert set(types_seen[1:-2]) == {"transcript-chunk"}
    assert events[0].data["language"] == "en"
    final = Transcript.from_event(events[-2])
    assert "".join(e.data["text"] for e in events[1:-2]) == final.text
    assert wer(SENTENCES["story"], final.text) <= 0.15, final.text


async def test_two_cycles_on_one_connection_and_22050_hz(
    wyoming: WyomingServer, speech: Callable[[str], Clip], wer: Any
) -> None:
    kitchen, weather = speech("kitchen"), speech("weather")
    client = AsyncTcpClient(HOST, port_of(wyoming))
    await client.connect()
    try:
        results: list[str] = []
        for pcm, rate in ((kitchen.pcm16k_bytes, 16000), (weather.pcm22k.astype("<i2").tobytes(), 22050)):
            await client.write_event(Transcribe(language="en").event())
            await client.write_event(AudioStart(rate=rate, width=2, channels=1).event())
            for chunk in pcm_chunks(pcm, rate):
                await client.write_event(chunk)
            await client.write_event(AudioStop().event())
            events = await read_until(client, "transcript-stop")
            results.append(Transcript.from_event(next(e for e in events if e.type == "transcript")).text)
    finally:
        await client.disconnect()
    assert wer(SENTENCES["kitchen"], results[0]) <= 0.15, results[0]
    assert wer(SENTENCES["weather"], results[1]) <= 0.15, results[1]


async def test_each_chunk_carries_its_own_format(
    wyoming: WyomingServer, speech: Callable[[str], Clip], wer: Any
) -> None:
    """audio-start says 16 kHz mono; the chunks say otherwise (first 22050 Hz mono, then 16 kHz stereo)."""
    clip = speech("remind")
    half22 = len(clip.pcm22k) // 2
    first = clip.pcm22k[:half22].astype("<i2").tobytes()
    rest16 = (np.clip(clip.audio16k[int(half22 * 16000 / 22050) :], -1, 1) * 32767).astype("<i2")
    second = np.repeat(rest16.reshape(-1, 1), 2, axis=1).astype("<i2").tobytes()
    client = AsyncTcpClient(HOST, port_of(wyoming))
    await client.connect()
    try:
        await client.write_event(Transcribe(language="en").event())
        await client.write_event(AudioStart(rate=16000, width=2, channels=1).event())
        for chunk in [*pcm_chunks(first, 22050), *pcm_chunks(second, 16000, channels=2)]:
            await client.write_event(chunk)
        await client.write_event(AudioStop().event())
        events = await read_until(client, "transcript")
    finally:
        await client.disconnect()
    text = Transcript.from_event(events[-1]).text
    assert wer(SENTENCES["remind"], text) <= 0.15, text


@pytest.mark.parametrize("kind", ["silence", "noise"])
async def test_silence_gives_an_empty_transcript(wyoming: WyomingServer, kind: str) -> None:
    audio = np.zeros(16000 * 2, np.float32) if kind == "silence" else noise(2.0, amplitude=0.02)
    pcm = (audio * 32767).astype("<i2").tobytes()
    text, _ = await home_assistant_stt(port_of(wyoming), pcm, "en")
    assert text == ""


# --- raw sockets -----------------------------------------------------------------------------


def frame(event_type: str, data: dict[str, Any] | None = None, payload: bytes = b"") -> bytes:
    header: dict[str, Any] = {"type": event_type}
    body = json.dumps(data).encode() if data else b""
    if body:
        header["data_length"] = len(body)
    if payload:
        header["payload_length"] = len(payload)
    return json.dumps(header).encode() + b"\n" + body + payload


async def read_raw_event(reader: asyncio.StreamReader) -> tuple[str, dict[str, Any], bytes]:
    header = json.loads(await asyncio.wait_for(reader.readline(), timeout=30))
    data: dict[str, Any] = header.get("data") or {}
    if header.get("data_length"):
        data.update(json.loads(await reader.readexactly(header["data_length"])))
    payload = await reader.readexactly(header["payload_length"]) if header.get("payload_length") else b""
    return header["type"], data, payload


async def assert_server_healthy(port: int) -> None:
    reader, writer = await asyncio.open_connection(HOST, port)
    try:
        writer.write(frame("describe"))
        kind, data, _ = await read_raw_event(reader)
        assert kind == "info"
        assert {m["name"] for m in data["asr"][0]["models"]} >= {"tiny.en", "base"}
    finally:
        writer.close()


def _pcm(clip: Clip) -> bytes:
    return clip.pcm16k_bytes


BAD_INPUTS: dict[str, tuple[Callable[[Clip], bytes], str, str]] = {
    # name: (bytes to send, expected error code, a phrase the error text must contain)
    "garbage line": (lambda _: b"hello there, server\n", "invalid_event", "JSON"),
    "not an object": (lambda _: b'["describe"]\n', "invalid_event", "JSON object"),
    "no type": (lambda _: b'{"data": {}}\n', "invalid_event", "type"),
    "data not an object": (lambda _: b'{"type": "describe", "data": [1]}\n', "invalid_event", "data"),
    "header too long": (lambda _: b'{"type": "' + b"x" * 70000, "event_too_large", "header line"),
    "data_length too large": (
        lambda _: json.dumps({"type": "transcribe", "data_length": MAX_EVENT_BYTES + 1}).encode() + b"\n",
        "event_too_large",
        "limit",
    ),
    "negative payload_length": (
        lambda _: json.dumps({"type": "audio-chunk", "payload_length": -5}).encode() + b"\n",
        "invalid_event",
        "negative",
    ),
    "string data_length": (
        lambda _: json.dumps({"type": "describe", "data_length": "12"}).encode() + b"\n",
        "invalid_event",
        "integer",
    ),
    "data block not JSON": (
        lambda _: json.dumps({"type": "transcribe", "data_length": 4}).encode() + b"\n\xff\xfe{}",
        "invalid_event",
        "data block",
    ),
    "unknown model": (lambda _: frame("transcribe", {"name": "no-such-model"}), "model_not_found", "no-such-model"),
    "invalid language": (lambda _: frame("transcribe", {"language": "klingon"}), "invalid_parameter", "klingon"),
    "bad audio format": (
        lambda _: frame("audio-start", {"rate": 16000, "width": 3.5, "channels": 1}),
        "invalid_audio",
        "width",
    ),
    "english-only model asked for german": (
        lambda clip: (
            frame("transcribe", {"name": "tiny.en", "language": "de"})
            + frame("audio-start", {"rate": 16000, "width": 2, "channels": 1})
            + frame("audio-chunk", {"rate": 16000, "width": 2, "channels": 1}, _pcm(clip)[:32000])
            + frame("audio-stop")
        ),
        "invalid_parameter",
        "English-only",
    ),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
async def test_bad_input_gets_an_error_and_the_server_carries_on(
    wyoming: WyomingServer, speech: Callable[[str], Clip], case: str
) -> None:
    build, code, phrase = BAD_INPUTS[case]
    reader, writer = await asyncio.open_connection(HOST, port_of(wyoming))
    try:
        writer.write(build(speech("kitchen")))
        await writer.drain()
        kind, data, _ = await read_raw_event(reader)
        assert kind == "error", (kind, data)
        assert data["code"] == code, data
        assert phrase in data["text"], data
        # The server ends that connection.
        assert await asyncio.wait_for(reader.read(), timeout=10) == b""
    finally:
        writer.close()
    await assert_server_healthy(port_of(wyoming))


MALFORMED_AUDIO: dict[str, tuple[list[Eventable], str]] = {
    # 3 bytes at width 2: a sample and a half.
    "chunk not whole frames": (
        [AudioStart(rate=16000, width=2, channels=1), AudioChunk(rate=16000, width=2, channels=1, audio=b"\x00" * 3)],
        "whole number of frames",
    ),
    "stereo chunk not whole frames": (
        [AudioStart(rate=16000, width=2, channels=2), AudioChunk(rate=16000, width=2, channels=2, audio=b"\x00" * 6)],
        "whole number of frames",
    ),
    "audio-stop without audio-start": ([Transcribe(language="en"), AudioStop()], "audio-stop without audio-start"),
}


@pytest.mark.parametrize("case", list(MALFORMED_AUDIO))
async def test_malformed_audio_gets_an_error_not_an_empty_transcript(wyoming: WyomingServer, case: str) -> None:
    sent, phrase = MALFORMED_AUDIO[case]
    client = AsyncTcpClient(HOST, port_of(wyoming))
    await client.connect()
    try:
        for eventable in sent:
            await client.write_event(eventable.event())
        with contextlib.suppress(ConnectionError):  # the server may close before the stop is read
            await client.write_event(AudioStop().event())
        event = await asyncio.wait_for(client.read_event(), timeout=30)
        assert event is not None and Error.is_type(event.type), event
        error = Error.from_event(event)
        assert error.code == "invalid_audio", error
        assert error.text is not None and phrase in error.text, error
        assert await asyncio.wait_for(client.read_event(), timeout=10) is None  # then the connection ends
    finally:
        await client.disconnect()
    await assert_server_healthy(port_of(wyoming))


async def test_audio_start_and_stop_without_chunks_is_an_empty_transcript(wyoming: WyomingServer) -> None:
    client = AsyncTcpClient(HOST, port_of(wyoming))
    await client.connect()
    try:
        await client.write_event(AudioStart(rate=16000, width=2, channels=1).event())
        await client.write_event(AudioStop().event())
        events = await read_until(client, "transcript")
    finally:
        await client.disconnect()
    assert Transcript.from_event(events[-1]).text == ""


async def test_unknown_event_types_are_ignored(wyoming: WyomingServer) -> None:
    reader, writer = await asyncio.open_connection(HOST, port_of(wyoming))
    try:
        writer.write(frame("run-satellite-v9", {"anything": [1, 2, 3]}, b"\x00\x01\x02"))
        writer.write(frame("describe"))
        kind, data, _ = await read_raw_event(reader)
        assert kind == "info"
        assert data["asr"][0]["name"] == "mediaserver"
    finally:
        writer.close()


async def wait_for_no_connections(server: WyomingServer, timeout_s: float = 10.0) -> None:
    async with asyncio.timeout(timeout_s):
        while server.connections:
            await asyncio.sleep(0.02)


@pytest.mark.parametrize("where", ["between chunks", "inside a chunk"])
async def test_disconnect_mid_audio_leaves_nothing_open(
    wyoming: WyomingServer, speech: Callable[[str], Clip], where: str
) -> None:
    pcm = speech("kitchen").pcm16k_bytes
    _, writer = await asyncio.open_connection(HOST, port_of(wyoming))
    writer.write(
        frame("transcribe", {"language": "en"}) + frame("audio-start", {"rate": 16000, "width": 2, "channels": 1})
    )
    fmt = {"rate": 16000, "width": 2, "channels": 1}
    for offset in range(0, 20 * 2048, 2048):
        writer.write(frame("audio-chunk", fmt, pcm[offset : offset + 2048]))
    if where == "inside a chunk":
        writer.write(frame("audio-chunk", fmt, pcm[:2048])[:-1000])
    await writer.drain()
    async with asyncio.timeout(10):  # the server holds the audio read so far
        while not (wyoming.connections and wyoming.budget.used_bytes > 0):
            await asyncio.sleep(0.01)
    writer.transport.abort()
    await wait_for_no_connections(wyoming)
    assert wyoming.budget.used_bytes == 0  # and gave it back


async def test_idle_connection_is_closed(base_settings: Settings, asr_service: AsrService) -> None:
    server = WyomingServer(base_settings.model_copy(update={"wyoming_idle_timeout_s": 0.3}), asr_service)
    port = await server.start(HOST, 0)
    try:
        reader, writer = await asyncio.open_connection(HOST, port)
        assert await asyncio.wait_for(reader.read(), timeout=5) == b""
        writer.close()
        await wait_for_no_connections(server)
    finally:
        await server.aclose()


async def test_cleanup_ctx_starts_and_closes_everything(base_settings: Settings, asr_service: AsrService) -> None:
    app = web.Application()
    app[SETTINGS] = base_settings.model_copy(update={"wyoming_host": HOST, "wyoming_port": 0})
    app[ASR] = asr_service
    app.cleanup_ctx.append(wyoming_ctx)
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        port = app[WYOMING_PORT]
        await assert_server_healthy(port)
        reader, writer = await asyncio.open_connection(HOST, port)  # left open on purpose
        writer.write(frame("transcribe", {"language": "en"}))
        await writer.drain()
    finally:
        await runner.cleanup()
    assert await asyncio.wait_for(reader.read(), timeout=5) == b""
    writer.close()
    with pytest.raises(OSError):
        await asyncio.open_connection(HOST, port)

    disabled = web.Application()
    disabled[SETTINGS] = base_settings.model_copy(update={"wyoming_enabled": False})
    disabled[ASR] = asr_service
    disabled.cleanup_ctx.append(wyoming_ctx)
    runner = web.AppRunner(disabled)
    await runner.setup()
    assert WYOMING_PORT not in disabled
    await runner.cleanup()


async def test_zeroconf_announcement(
    base_settings: Settings, asr_service: AsrService, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The zeroconf package is optional; a stand-in records what would be announced."""
    calls: list[tuple[str, Any]] = []

    class FakeServiceInfo:
        def __init__(self, type_: str, name: str, *, addresses: list[bytes], port: int) -> None:
            self.type, self.name, self.addresses, self.port = type_, name, addresses, port

    class FakeZeroconf:
        async def async_register_service(self, info: FakeServiceInfo) -> None:
            calls.append(("register", info))

        async def async_unregister_service(self, info: FakeServiceInfo) -> None:
            calls.append(("unregister", info))

        async def async_close(self) -> None:
            calls.append(("close", None))

    package = types.ModuleType("zeroconf")
    module = types.ModuleType("zeroconf.asyncio")
    module.AsyncServiceInfo = FakeServiceInfo  # type: ignore[attr-defined]
    module.AsyncZeroconf = FakeZeroconf  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "zeroconf", package)
    monkeypatch.setitem(sys.modules, "zeroconf.asyncio", module)

    settings = base_settings.model_copy(update={"wyoming_zeroconf": True, "wyoming_zeroconf_name": "kitchen-box"})
    server = WyomingServer(settings, asr_service)
    port = await server.start(HOST, 0)
    await server.aclose()
    assert [c[0] for c in calls] == ["register", "unregister", "close"]
    info = calls[0][1]
    assert (info.type, info.name, info.port) == ("_wyoming._tcp.local.", "kitchen-box._wyoming._tcp.local.", port)
    assert info.addresses == [bytes([127, 0, 0, 1])]
