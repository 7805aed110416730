"""Wyoming speech out as Home Assistant uses it, with the ``wyoming`` package's own client:
``describe`` lists the voices, ``synthesize`` speaks, and the streaming form speaks each sentence
while the rest of the text is still arriving."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest
import pytest_asyncio
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.event import Event
from wyoming.info import Describe, Info
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop, SynthesizeVoice

from mediaserver.asr.service import AsrService
from mediaserver.audio.decode import resample_mono
from mediaserver.capabilities import Capabilities, Feature
from mediaserver.config import Settings
from mediaserver.events import TranscriptionOptions
from mediaserver.transport.wyoming.server import WyomingServer
from mediaserver.tts.service import TtsService
from tests.faults import one_sentence_later

HOST = "127.0.0.1"
ANSWER = "The front door is locked. The alarm is set for 6:30 tomorrow. Sleep well, Anna."


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def wyoming(base_settings: Settings, asr_service: AsrService, tts_service: TtsService) -> AsyncIterator[int]:
    server = WyomingServer(base_settings, asr_service, tts=tts_service)
    port = await server.start(HOST, 0)
    yield port
    await server.aclose()


async def connect(port: int) -> AsyncTcpClient:
    client = AsyncTcpClient(HOST, port)
    await client.connect()
    return client


async def read(client: AsyncTcpClient) -> Event:
    event = await asyncio.wait_for(client.read_event(), timeout=60)
    assert event is not None, "the server closed the connection"
    return event


def pcm_of(events: list[Event]) -> tuple[np.ndarray, int]:
    chunks = [AudioChunk.from_event(e) for e in events if AudioChunk.is_type(e.type)]
    assert chunks and {(c.rate, c.width, c.channels) for c in chunks} == {(22050, 2, 1)}
    pcm = np.frombuffer(b"".join(c.audio for c in chunks), "<i2").astype(np.float32) / 32768.0
    return pcm, chunks[0].rate


async def heard(asr: AsrService, events: list[Event]) -> str:
    pcm, rate = pcm_of(events)
    transcript = await asr.transcribe(resample_mono(pcm, rate), TranscriptionOptions(language="en"), model="base")
    return transcript.text


async def test_describe_lists_the_tts_program_and_its_voices(wyoming: int) -> None:
    client = await connect(wyoming)
    try:
        await client.write_event(Describe().event())
        info = Info.from_event(await read(client))
    finally:
        await client.disconnect()
    assert len(info.asr) == 1  # ASR is still there
    assert len(info.tts) == 1
    program = info.tts[0]
    assert program.installed and program.supports_synthesize_streaming and program.attribution.url
    voice = program.voices[0]
    assert voice.name == "en_US-joe-medium" and voice.languages == ["en-US"] and voice.installed


async def test_synthesize(wyoming: int, asr_service: AsrService, wer: Any) -> None:
    """Home Assistant's plain form: one synthesize, audio until audio-stop."""
    client = await connect(wyoming)
    events: list[Event] = []
    try:
        await client.write_event(Synthesize(text=ANSWER, voice=SynthesizeVoice(name="en_US-joe-medium")).event())
        while not events or not AudioStop.is_type(events[-1].type):
            events.append(await read(client))
    finally:
        await client.disconnect()
    kinds = [e.type for e in events]
    assert kinds[0] == "audio-start" and kinds[-1] == "audio-stop"
    assert set(kinds[1:-1]) == {"audio-chunk"} and len(kinds) > 10
    start = AudioStart.from_event(events[0])
    assert (start.rate, start.width, start.channels) == (22050, 2, 1)
    assert wer(ANSWER, await heard(asr_service, events)) <= 0.15


async def test_synthesize_by_language_and_alias(wyoming: int) -> None:
    for voice in (SynthesizeVoice(language="en_US"), SynthesizeVoice(name="CLB"), None):
        client = await connect(wyoming)
        try:
            await client.write_event(Synthesize(text="Done.", voice=voice).event())
            first = await read(client)
        finally:
            await client.disconnect()
        assert AudioStart.is_type(first.type), (voice, first)


async def test_streaming_synthesis_speaks_while_the_text_arrives(
    wyoming: int, asr_service: AsrService, wer: Any
) -> None:
    """As Home Assistant streams an LLM answer: synthesize-start, chunks, synthesize, stop."""
    client = await connect(wyoming)
    events: list[Event] = []
    try:
        await client.write_event(SynthesizeStart(voice=SynthesizeVoice(name="alloy")).event())
        first_sentence, rest = ANSWER.split(" The alarm")
        for token in [first_sentence[:9], first_sentence[9:], " The"]:
            await client.write_event(SynthesizeChunk(text=token).event())
        # The first sentence is spoken before any more text is sent.
        while not events or not AudioStop.is_type(events[-1].type):
            events.append(await read(client))
        spoken_early = len(events)
        for token in [" alarm", rest[:12], rest[12:]]:
            await client.write_event(SynthesizeChunk(text=token).event())
        await client.write_event(Synthesize(text=ANSWER).event())  # the compatibility copy: ignored
        await client.write_event(SynthesizeStop().event())
        while events[-1].type != "synthesize-stopped":
            events.append(await read(client))
    finally:
        await client.disconnect()
    kinds = [e.type for e in events]
    assert kinds.count("audio-start") == kinds.count("audio-stop") == 3  # one per sentence
    assert kinds[spoken_early - 1] == "audio-stop"
    assert kinds[-1] == "synthesize-stopped" and kinds[-2] == "audio-stop"
    assert wer(ANSWER, await heard(asr_service, events)) <= 0.15


async def test_two_requests_on_one_connection(wyoming: int) -> None:
    client = await connect(wyoming)
    try:
        for text in ("One.", "Two."):
            await client.write_event(SynthesizeStart().event())
            await client.write_event(SynthesizeChunk(text=text).event())
            await client.write_event(SynthesizeStop().event())
            kinds: list[str] = []
            while not kinds or kinds[-1] != "synthesize-stopped":
                kinds.append((await read(client)).type)
            assert kinds[0] == "audio-start" and kinds[-2:] == ["audio-stop", "synthesize-stopped"]
        await client.write_event(Synthesize(text="Three.").event())
        assert AudioStart.is_type((await read(client)).type)
    finally:
        await client.disconnect()


@pytest.mark.parametrize("text", ["🙂", "...", "🎉 🎉!"])
async def test_text_with_nothing_to_read_is_an_answer_of_no_audio(wyoming: int, text: str) -> None:
    """An LLM's reply of emoji or marks alone: 100 ms of silence, no error (Home Assistant showed a
    TTS failure), and not a WAV of no frames (players refuse it: a later trial); the connection goes on."""
    client = await connect(wyoming)
    try:
        await client.write_event(Synthesize(text=text).event())
        events = [await read(client) for _ in range(3)]
        assert [e.type for e in events] == ["audio-start", "audio-chunk", "audio-stop"]
        chunk = AudioChunk.from_event(events[1])
        assert len(chunk.audio) == 2 * chunk.rate // 10 and not any(chunk.audio)
        await client.write_event(Synthesize(text="Three.").event())
        assert AudioStart.is_type((await read(client)).type)
    finally:
        await client.disconnect()


@pytest.mark.parametrize(
    ("event", "code", "phrase"),
    [
        (Event("synthesize", {}), "invalid_parameter", "'text' string"),
        (Synthesize(text="   ").event(), "invalid_parameter", "empty"),
        (Synthesize(text="x" * 5000).event(), "text_too_long", "tts_max_input_chars"),
        (Synthesize(text="Hi.", voice=SynthesizeVoice(name="nobody")).event(), "voice_not_found", "voices:"),
        # The bundled voice has one speaker: naming one is an error, not the default speaker (the
        # wyoming package sends voice.speaker only with voice.name).
        (
            Synthesize(text="Hi.", voice=SynthesizeVoice(name="en_US-joe-medium", speaker="nobody")).event(),
            "speaker_not_found",
            "has one speaker",
        ),
        (SynthesizeStart(voice=SynthesizeVoice(name="CLB", speaker="3")).event(), "speaker_not_found", "one speaker"),
        (Event("synthesize", {"text": "Hi.", "voice": "joe"}), "invalid_parameter", "voice must be an object"),
        (SynthesizeChunk(text="orphan").event(), "invalid_parameter", "before synthesize-start"),
    ],
)
async def test_bad_input_is_an_error_event(wyoming: int, event: Event, code: str, phrase: str) -> None:
    client = await connect(wyoming)
    try:
        await client.write_event(event)
        reply = await read(client)
    finally:
        await client.disconnect()
    assert Error.is_type(reply.type), reply
    error = Error.from_event(reply)
    assert error.code == code and phrase in error.text, error


async def test_disconnect_mid_stream_drops_the_rest(wyoming: int, tts_service: TtsService) -> None:
    voice = await tts_service.voice(None)
    scheduler = (await tts_service.load(voice)).scheduler
    client = await connect(wyoming)
    await client.write_event(SynthesizeStart().event())
    for n in range(1, 16):
        await client.write_event(SynthesizeChunk(text=f"This is streamed sentence number {n}. ").event())
    assert AudioStart.is_type((await read(client)).type)
    await client.disconnect()
    async with asyncio.timeout(10):
        while scheduler.open_streams:
            await asyncio.sleep(0.05)
    done = scheduler.sentences_done
    await one_sentence_later(tts_service, voice)  # what was running finishes; nothing new starts
    assert scheduler.sentences_done - done <= 1 + 1


async def test_tts_switched_off(base_settings: Settings, asr_service: AsrService, tts_service: TtsService) -> None:
    capabilities = Capabilities({"tts": Feature("tts", False, "switched off in settings (tts_enabled=false)")})
    server = WyomingServer(base_settings, asr_service, tts=tts_service, capabilities=capabilities)
    port = await server.start(HOST, 0)
    try:
        client = await connect(port)
        try:
            await client.write_event(Describe().event())
            info = Info.from_event(await read(client))
            await client.write_event(Synthesize(text="Hello.").event())
            reply = await read(client)
        finally:
            await client.disconnect()
    finally:
        await server.aclose()
    assert info.tts == [] and len(info.asr) == 1
    error = Error.from_event(reply)
    assert error.code == "feature_disabled" and "tts_enabled=false" in error.text
