"""Wyoming wake word detection as Home Assistant uses it: the ``wyoming`` package's own client,
``detect`` → audio → ``detection`` or ``not-detected``, with Piper speaking the wake words and the
microWakeWord models from the ``pymicro-wakeword`` wheel; plus the faults a client can cause."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np
import pytest
import pytest_asyncio
from wyoming.asr import Transcribe, Transcript
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.event import Event
from wyoming.info import Describe, Info
from wyoming.wake import Detect, Detection

from mediaserver.asr.service import AsrService
from mediaserver.config import Settings
from mediaserver.transport.wyoming.server import WyomingServer
from tests.conftest import SENTENCES, long_clip, resample_to, synthesize

HOST = "127.0.0.1"
CHUNK_SAMPLES = 1024  # per audio-chunk, as Home Assistant and ESPHome send them
LEAD_S = 1.0  # silence before the speech
# (what Piper says, the model that must hear it, the phrase alone: where the wake word ends)
WAKE_CASES = [
    ("okay nabu, turn on the lights", "okay_nabu", "okay nabu,"),
    ("hey jarvis, what time is it", "hey_jarvis", "hey jarvis,"),
]


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def wyoming(base_settings: Settings, asr_service: AsrService) -> AsyncIterator[WyomingServer]:
    server = WyomingServer(base_settings, asr_service)
    await server.start(HOST, 0)
    yield server
    await server.aclose()


def port_of(server: WyomingServer) -> int:
    assert server.port is not None
    return server.port


def pcm16(samples: np.ndarray) -> bytes:
    return bytes((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes())


@functools.cache
def spoken(text: str) -> np.ndarray:
    """Piper saying ``text`` after LEAD_S of silence and followed by 1 s of silence, 16 kHz float."""
    return np.concatenate([np.zeros(int(16000 * LEAD_S), np.float32), synthesize(text).audio16k, np.zeros(16000)])


def word_end_s(phrase: str) -> float:
    """Where the wake word ends in the stream: the end of the phrase said alone (its last loud sample)."""
    audio = synthesize(phrase).audio16k
    return LEAD_S + float(np.nonzero(np.abs(audio) > 0.02)[0][-1]) / 16000


def chunks(pcm: bytes, rate: int = 16000, width: int = 2, channels: int = 1) -> list[Event]:
    step = CHUNK_SAMPLES * width * channels
    return [
        AudioChunk(rate=rate, width=width, channels=channels, audio=pcm[i : i + step]).event()
        for i in range(0, len(pcm), step)
    ]


async def connect(port: int) -> AsyncTcpClient:
    client = AsyncTcpClient(HOST, port)
    await client.connect()
    return client


async def read(client: AsyncTcpClient, timeout_s: float = 30.0) -> Event:
    event = await asyncio.wait_for(client.read_event(), timeout=timeout_s)
    assert event is not None, "the server closed the connection"
    return event


async def detect_stream(
    port: int, pcm: bytes, names: list[str] | None, *, rate: int = 16000, width: int = 2, channels: int = 1
) -> list[Event]:
    """detect, audio-start, every chunk, audio-stop; the events the server sent until not-detected or
    until it closes after the detections (the server sends nothing else at audio-stop then)."""
    client = await connect(port)
    try:
        await client.write_event(Detect(names=names).event())
        await client.write_event(AudioStart(rate=rate, width=width, channels=channels).event())
        for event in chunks(pcm, rate, width, channels):
            await client.write_event(event)
        await client.write_event(AudioStop().event())
        await client.write_event(Describe().event())  # a marker: its info comes after everything else
        events: list[Event] = []
        while (event := await read(client)).type != "info":
            events.append(event)
            if event.type == "error":
                break
        return events
    finally:
        await client.disconnect()


async def test_describe_lists_the_wake_program(wyoming: WyomingServer) -> None:
    client = await connect(port_of(wyoming))
    try:
        await client.write_event(Describe().event())
        info = Info.from_event(await read(client))
    finally:
        await client.disconnect()
    assert len(info.wake) == 1
    models = {m.name: m for m in info.wake[0].models}
    assert {"okay_nabu", "hey_jarvis", "hey_mycroft", "alexa"} <= set(models)
    assert models["okay_nabu"].phrase == "Okay Nabu"
    assert "en" in models["okay_nabu"].languages
    assert info.asr and info.asr[0].name == "mediaserver"  # speech to text is still there beside it


@pytest.mark.parametrize(("text", "name", "phrase"), WAKE_CASES)
async def test_wake_word_is_detected_as_soon_as_it_is_heard(
    wyoming: WyomingServer, text: str, name: str, phrase: str
) -> None:
    """The detection arrives while audio is still streaming, within 1 s (of audio) after the word."""
    pcm = pcm16(spoken(text))
    end_s = word_end_s(phrase)
    until = int((end_s + 1.0) * 16000) * 2  # only the audio up to 1 s after the word
    client = await connect(port_of(wyoming))
    try:
        await client.write_event(Detect(names=[name]).event())
        await client.write_event(AudioStart(rate=16000, width=2, channels=1).event())
        for event in chunks(pcm[:until]):
            await client.write_event(event)
        event = await read(client)  # no audio-stop sent: the detection must come on its own
        assert event.type == "detection", event
        detection = Detection.from_event(event)
        assert detection.name == name
        assert detection.timestamp is not None
        assert end_s - 0.5 <= detection.timestamp / 1000 <= end_s + 1.0, (detection.timestamp, end_s)
        for event in chunks(pcm[until:]):
            await client.write_event(event)
        await client.write_event(AudioStop().event())
        await client.write_event(Describe().event())
        assert (await read(client)).type == "info"  # no not-detected after a detection
    finally:
        await client.disconnect()


async def test_detect_without_names_listens_for_every_model(wyoming: WyomingServer) -> None:
    for text, name, _ in WAKE_CASES:
        events = await detect_stream(port_of(wyoming), pcm16(spoken(text)), None)
        assert [e.type for e in events] == ["detection"], events
        assert Detection.from_event(events[0]).name == name


async def test_names_may_be_phrases(wyoming: WyomingServer) -> None:
    events = await detect_stream(port_of(wyoming), pcm16(spoken(WAKE_CASES[0][0])), ["Okay Nabu"])
    assert [(e.type, e.data.get("name")) for e in events] == [("detection", "okay_nabu")]


def _white_noise(seconds: float) -> np.ndarray:
    return (np.random.default_rng(7).standard_normal(int(16000 * seconds)) * 0.1).astype(np.float32)


NO_WAKE_AUDIO: dict[str, Callable[[], np.ndarray]] = {
    "speech": lambda: long_clip(tuple(SENTENCES), pause_s=0.5, repeat=1).audio16k,
    "silence": lambda: np.zeros(16000 * 10, np.float32),
    "white noise": lambda: _white_noise(10),
}


@pytest.mark.parametrize("kind", list(NO_WAKE_AUDIO))
async def test_no_wake_word_gives_not_detected(wyoming: WyomingServer, kind: str) -> None:
    events = await detect_stream(port_of(wyoming), pcm16(NO_WAKE_AUDIO[kind]()), None)
    assert [e.type for e in events] == ["not-detected"], events


@pytest.mark.parametrize(("rate", "channels"), [(22050, 1), (48000, 2), (8000, 1)])
async def test_other_formats_are_resampled(wyoming: WyomingServer, rate: int, channels: int) -> None:
    clip = synthesize(WAKE_CASES[0][0])
    lead = np.zeros(rate, np.float32)
    audio = np.concatenate([lead, resample_to(clip, rate), lead]) if rate != 22050 else None
    if audio is None:
        audio = np.concatenate([lead, clip.pcm22k.astype(np.float32) / 32768, lead])
    samples = np.repeat(audio[:, None], channels, axis=1).reshape(-1)
    events = await detect_stream(port_of(wyoming), pcm16(samples), ["okay_nabu"], rate=rate, channels=channels)
    assert [(e.type, e.data.get("name")) for e in events] == [("detection", "okay_nabu")], (rate, events)


async def test_unknown_model_is_an_error_listing_the_models(wyoming: WyomingServer) -> None:
    client = await connect(port_of(wyoming))
    try:
        await client.write_event(Detect(names=["hey_computer"]).event())
        event = await read(client)
        assert event.type == "error", event
        assert event.data["code"] == "model_not_found"
        for name in ("hey_computer", "okay_nabu", "hey_jarvis", "alexa", "hey_mycroft"):
            assert name in event.data["text"], event.data
        assert await asyncio.wait_for(client.read_event(), timeout=10) is None  # the connection is closed
    finally:
        await client.disconnect()


@pytest.mark.parametrize(
    ("fmt", "phrase"),
    [({"rate": 16000, "width": 5, "channels": 1}, "sample width"), ({"rate": 50, "width": 2, "channels": 1}, "rate")],
)
async def test_a_format_no_model_can_take_is_a_clear_error(
    wyoming: WyomingServer, fmt: dict[str, int], phrase: str
) -> None:
    client = await connect(port_of(wyoming))
    try:
        await client.write_event(Detect(names=["okay_nabu"]).event())
        await client.write_event(AudioStart(**fmt).event())
        event = await read(client)
        assert event.type == "error" and event.data["code"] == "invalid_audio", event
        assert phrase in event.data["text"], event.data
    finally:
        await client.disconnect()


async def test_transcribe_after_detect_on_one_connection(wyoming: WyomingServer, wer: Any) -> None:
    """A satellite's flow: wake word heard, then the command transcribed on the same connection."""
    client = await connect(port_of(wyoming))
    try:
        await client.write_event(Detect(names=["okay_nabu"]).event())
        await client.write_event(AudioStart(rate=16000, width=2, channels=1).event())
        for event in chunks(pcm16(spoken(WAKE_CASES[0][0]))):
            await client.write_event(event)
        assert (await read(client)).type == "detection"
        await client.write_event(Transcribe(language="en").event())
        await client.write_event(AudioStart(rate=16000, width=2, channels=1).event())
        for event in chunks(pcm16(synthesize(SENTENCES["kitchen"]).audio16k)):
            await client.write_event(event)
        await client.write_event(AudioStop().event())
        while (event := await read(client, 60)).type != "transcript":
            assert event.type != "error", event
        assert wer(SENTENCES["kitchen"], Transcript.from_event(event).text) <= 0.15
    finally:
        await client.disconnect()


async def wait_for_no_connections(server: WyomingServer, timeout_s: float = 10.0) -> None:
    async with asyncio.timeout(timeout_s):
        while server.connections:
            await asyncio.sleep(0.02)


async def test_a_stream_without_audio_stop_is_closed_when_idle(
    base_settings: Settings, asr_service: AsrService
) -> None:
    server = WyomingServer(base_settings.model_copy(update={"wyoming_idle_timeout_s": 0.5}), asr_service)
    port = await server.start(HOST, 0)
    try:
        client = await connect(port)
        await client.write_event(Detect(names=["okay_nabu"]).event())
        await client.write_event(AudioStart(rate=16000, width=2, channels=1).event())
        for event in chunks(pcm16(np.zeros(16000, np.float32))):
            await client.write_event(event)
        # ... and then nothing: the server closes the connection and forgets the detector.
        assert await asyncio.wait_for(client.read_event(), timeout=10) is None
        await client.disconnect()
        await wait_for_no_connections(server)
    finally:
        await server.aclose()


async def test_hundreds_of_detect_connections_are_bounded(base_settings: Settings, asr_service: AsrService) -> None:
    limit, attempts = 8, 200
    server = WyomingServer(base_settings.model_copy(update={"wyoming_max_connections": limit}), asr_service)
    port = await server.start(HOST, 0)
    clients: list[AsyncTcpClient] = []
    try:
        served = refused = 0
        for _ in range(attempts):
            client = await connect(port)
            clients.append(client)
            await client.write_event(Detect(names=["okay_nabu"]).event())
            await client.write_event(AudioStart(rate=16000, width=2, channels=1).event())
            await client.write_event(Describe().event())
            event = await read(client)
            if event.type == "info":
                served += 1
            else:
                assert event.type == "error" and event.data["code"] == "too_many_connections", event
                refused += 1
                await client.disconnect()
            assert len(server.connections) <= limit + 1  # one being turned away at most
        assert served == limit and refused == attempts - limit
    finally:
        for client in clients:
            await client.disconnect()
        await wait_for_no_connections(server)
        await server.aclose()


async def test_metrics_count_wake_words_errors_and_audio_abandoned(
    wyoming: WyomingServer, asr_service: AsrService
) -> None:
    """What a Home Assistant trial found missing from /metrics: wake words heard, error events sent to
    Wyoming clients, the open connections, and audio a client sent and abandoned without audio-stop
    (counted as received, as the streams count theirs)."""
    registry = asr_service.metrics.registry

    def value(name: str, labels: dict[str, str] | None = None) -> float:
        return registry.get_sample_value(name, labels or {}) or 0.0

    text, name, _ = WAKE_CASES[0]
    wakes = value("mediaserver_wake_detections_total", {"route": "wyoming", "name": name})
    events = await detect_stream(port_of(wyoming), pcm16(spoken(text)), [name])
    assert [e.type for e in events] == ["detection"], events
    assert value("mediaserver_wake_detections_total", {"route": "wyoming", "name": name}) == wakes + 1

    errors = value("mediaserver_wyoming_errors_total", {"code": "model_not_found"})
    await detect_stream(port_of(wyoming), pcm16(spoken(text)), ["no_such_word"])
    assert value("mediaserver_wyoming_errors_total", {"code": "model_not_found"}) == errors + 1

    heard = value("mediaserver_audio_seconds_total", {"route": "wyoming"})
    async with asyncio.timeout(10):  # the connections above are closed on the server's side too
        while wyoming.served:
            await asyncio.sleep(0.02)
    open_before = value("mediaserver_wyoming_connections")  # (the metrics are the test session's)
    client = await connect(port_of(wyoming))
    await client.write_event(Transcribe(language="en").event())
    await client.write_event(AudioStart(rate=16000, width=2, channels=1).event())
    for event in chunks(pcm16(np.zeros(32000, np.float32))):  # 2 s, then gone without audio-stop
        await client.write_event(event)
    await client.write_event(Describe().event())
    assert (await read(client)).type == "info"  # every chunk before it was read
    assert value("mediaserver_wyoming_connections") == open_before + 1 and wyoming.served >= 1
    await client.disconnect()
    assert value("mediaserver_audio_seconds_total", {"route": "wyoming"}) == pytest.approx(heard + 2.0)
    async with asyncio.timeout(10):
        while wyoming.served:
            await asyncio.sleep(0.02)
    assert value("mediaserver_wyoming_connections") == open_before
