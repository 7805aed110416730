"""Wyoming access and memory (issue #14, item 5), with the ``wyoming`` package's own client: with auth
on the port listens on loopback unless ``wyoming_host`` says otherwise, ``wyoming_allowed_networks``
turns other clients away, ``wyoming_max_connections`` caps connections, and the audio all
connections hold is bounded by ``wyoming_max_buffered_audio_bytes``, each refusal an ``error``."""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest
import pytest_asyncio
from aiohttp import web
from wyoming.asr import Transcribe
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.event import Event
from wyoming.info import Describe
from wyoming.tts import SynthesizeChunk, SynthesizeStart, SynthesizeStop

from mediaserver.asr.service import AsrService
from mediaserver.config import Settings
from mediaserver.state import ASR, SETTINGS
from mediaserver.transport.wyoming.server import WYOMING_PORT, WYOMING_SERVER, WyomingServer, wyoming_ctx
from mediaserver.tts.service import TtsService

HOST = "127.0.0.1"
FMT = {"rate": 16000, "width": 2, "channels": 1}


async def _bound_host(settings: Settings, asr: AsrService) -> str:
    """Start Wyoming through the app's cleanup context; the address it bound."""
    app = web.Application()
    app[SETTINGS] = settings.model_copy(update={"wyoming_port": 0})
    app[ASR] = asr
    app.cleanup_ctx.append(wyoming_ctx)
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        server = app[WYOMING_SERVER]
        assert server._server is not None and app[WYOMING_PORT] > 0
        return str(server._server.sockets[0].getsockname()[0])
    finally:
        await runner.cleanup()


async def test_with_auth_on_wyoming_listens_on_loopback_unless_told_otherwise(
    base_settings: Settings, asr_service: AsrService, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="mediaserver.transport.wyoming")
    unset = base_settings.model_copy(update={"wyoming_host": None})
    host = await _bound_host(unset.model_copy(update={"api_keys": ["k"]}), asr_service)
    assert host == "127.0.0.1"
    host = await _bound_host(unset.model_copy(update={"basic_auth_user": "u", "basic_auth_password": "p"}), asr_service)
    assert host == "127.0.0.1"
    assert any("loopback" in r.getMessage() or "127.0.0.1 only" in r.getMessage() for r in caplog.records)
    host = await _bound_host(unset, asr_service)  # no auth anywhere: as before, every interface
    assert host == "0.0.0.0"
    caplog.clear()
    exposed = unset.model_copy(update={"api_keys": ["k"], "wyoming_host": "0.0.0.0"})
    host = await _bound_host(exposed, asr_service)  # an explicit choice, and a warning
    assert host == "0.0.0.0"
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings and "without authentication" in warnings[0].getMessage()


def test_allowed_networks_are_validated() -> None:
    assert Settings(wyoming_allowed_networks=[" 192.168.1.0/24", "::1"]).wyoming_allowed_networks == [
        "192.168.1.0/24",
        "::1",
    ]
    with pytest.raises(ValueError, match="not-a-network"):
        Settings(wyoming_allowed_networks=["not-a-network"])


@pytest_asyncio.fixture(loop_scope="session")
async def server_with(base_settings: Settings, asr_service: AsrService) -> AsyncIterator[Any]:
    """Start a Wyoming server with settings overrides; all are closed after the test."""
    started: list[WyomingServer] = []

    async def start(**overrides: Any) -> tuple[WyomingServer, int]:
        server = WyomingServer(base_settings.model_copy(update=overrides), asr_service)
        started.append(server)
        return server, await server.start(HOST, 0)

    yield start
    for server in started:
        await server.aclose()


async def _client(port: int) -> AsyncTcpClient:
    client = AsyncTcpClient(HOST, port)
    await client.connect()
    return client


async def _ask(client: AsyncTcpClient, event: Event) -> Event:
    await client.write_event(event)
    answer = await asyncio.wait_for(client.read_event(), timeout=30)
    assert answer is not None, "connection closed without an answer"
    return answer


async def test_clients_outside_the_allowed_networks_are_refused(server_with: Any) -> None:
    server, port = await server_with(wyoming_allowed_networks=["10.0.0.0/8"])
    try:
        client = await _client(port)
        refused = await _ask(client, Describe().event())
        assert refused.type == "error" and refused.data["code"] == "forbidden", refused
        assert await asyncio.wait_for(client.read_event(), timeout=10) is None  # and closed
        await client.disconnect()
    finally:
        await server.aclose()
    server, port = await server_with(wyoming_allowed_networks=["10.0.0.0/8", "127.0.0.0/8"])
    try:
        client = await _client(port)
        assert (await _ask(client, Describe().event())).type == "info"
        await client.disconnect()
    finally:
        await server.aclose()


async def test_connections_past_the_cap_are_refused(server_with: Any) -> None:
    server, port = await server_with(wyoming_max_connections=2)
    try:
        first, second = await _client(port), await _client(port)
        for client in (first, second):
            assert (await _ask(client, Describe().event())).type == "info"
        third = await _client(port)
        refused = await _ask(third, Describe().event())
        assert refused.type == "error" and refused.data["code"] == "too_many_connections", refused
        await third.disconnect()
        await first.disconnect()
        async with asyncio.timeout(10):
            while len(server.connections) > 1:
                await asyncio.sleep(0.02)
        fourth = await _client(port)  # a slot is free again
        assert (await _ask(fourth, Describe().event())).type == "info"
        await fourth.disconnect()
        await second.disconnect()
    finally:
        await server.aclose()


def _noise(seconds: float, seed: int) -> bytes:
    samples = np.random.default_rng(seed).standard_normal(int(16000 * seconds)) * 300
    return samples.astype("<i2").tobytes()


async def _send_audio(client: AsyncTcpClient, pcm: bytes, *, stop: bool) -> None:
    await client.write_event(Transcribe(language="en").event())
    await client.write_event(AudioStart(**FMT).event())
    for offset in range(0, len(pcm), 32000):
        await client.write_event(AudioChunk(audio=pcm[offset : offset + 32000], **FMT).event())
    if stop:
        await client.write_event(AudioStop().event())


async def test_buffered_audio_across_connections_is_bounded(server_with: Any) -> None:
    budget = 512 * 1024
    server, port = await server_with(wyoming_max_buffered_audio_bytes=budget)
    try:
        holder = await _client(port)
        await _send_audio(holder, _noise(10, 1), stop=False)  # 320 kB held, no audio-stop yet
        async with asyncio.timeout(10):
            while server.budget.used_bytes < 320000:
                await asyncio.sleep(0.02)
        greedy = await _client(port)
        await _send_audio(greedy, _noise(7, 2), stop=False)  # 224 kB more: over the budget
        refused = await asyncio.wait_for(greedy.read_event(), timeout=30)
        assert refused is not None and refused.type == "error" and refused.data["code"] == "audio_buffer_full"
        assert "wyoming_max_buffered_audio_bytes" in refused.data["text"]
        await greedy.disconnect()
        await holder.write_event(AudioStop().event())  # the holder finishes normally
        events = []
        while (event := await asyncio.wait_for(holder.read_event(), timeout=60)) is not None:
            events.append(event.type)
            if event.type == "transcript-stop":
                break
        assert "transcript" in events
        async with asyncio.timeout(10):
            while server.budget.used_bytes:
                await asyncio.sleep(0.02)
        latecomer = await _client(port)  # the budget is free again
        await _send_audio(latecomer, _noise(7, 3), stop=True)
        answer = await asyncio.wait_for(latecomer.read_event(), timeout=60)
        assert answer is not None and answer.type == "transcript-start"
        await latecomer.disconnect()
        await holder.disconnect()
    finally:
        await server.aclose()
    assert server.budget.used_bytes == 0


async def test_a_streamed_synthesis_past_its_bound_speaks_what_came_within_it(
    base_settings: Settings, asr_service: AsrService, tts_service: TtsService, caplog: pytest.LogCaptureFixture
) -> None:
    """An answer streamed sentence by sentence, as an LLM's comes, past tts_max_streamed_chars (300
    here): the client is told once (an error event, text_too_long), the sentences within the bound
    are all spoken, the rest is not, and the stream ends as usual with synthesize-stopped, the
    connection open. A user trial: an answer of 5470 characters was refused at 4096 by closing the
    connection, and the sentences already sent were lost. No error is logged (an earlier trial: a
    traceback at ERROR for a client's long text)."""
    limit = 300
    settings = base_settings.model_copy(update={"tts_max_streamed_chars": limit})
    server = WyomingServer(settings, asr_service, tts=tts_service)
    port = await server.start(HOST, 0)
    caplog.set_level(logging.INFO)
    sentence = "Hello there, this is one more sentence of a long answer. "
    try:
        client = await _client(port)
        await client.write_event(SynthesizeStart().event())
        for _ in range(limit // len(sentence) + 4):  # as an LLM's answer comes: a sentence every 50 ms
            await client.write_event(SynthesizeChunk(text=sentence).event())
            await asyncio.sleep(0.05)
        await client.write_event(SynthesizeStop().event())
        events: list[Event] = []
        async with asyncio.timeout(120):
            while (event := await client.read_event()) is not None:
                events.append(event)
                if event.type == "synthesize-stopped":
                    break
        kinds = [e.type for e in events]
        errors = [e for e in events if e.type == "error"]
        assert len(errors) == 1 and errors[0].data["code"] == "text_too_long", kinds
        assert "tts_max_streamed_chars" in errors[0].data["text"]
        assert kinds[-1] == "synthesize-stopped", [k for k in kinds if k != "audio-chunk"]
        # Every whole sentence within the bound spoken, and the piece of the one it cut (its own audio).
        assert kinds.count("audio-start") == limit // len(sentence) + 1, [k for k in kinds if k != "audio-chunk"]
        await client.write_event(Describe().event())  # the connection is still open
        assert (await asyncio.wait_for(client.read_event(), timeout=30)) is not None
        await client.disconnect()
    finally:
        await server.aclose()
    gc.collect()  # a task whose exception was never retrieved says so when it is collected
    errors_logged = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors_logged, errors_logged


async def test_a_streamed_synthesis_is_bounded_even_without_a_sentence_end(
    base_settings: Settings, asr_service: AsrService, tts_service: TtsService
) -> None:
    """Text without a sentence end piles up unspoken: past tts_max_streamed_chars the client is told
    at once, and what came within the bound is spoken at synthesize-stop."""
    limit = 250
    settings = base_settings.model_copy(update={"tts_max_streamed_chars": limit})
    server = WyomingServer(settings, asr_service, tts=tts_service)
    port = await server.start(HOST, 0)
    try:
        client = await _client(port)
        await client.write_event(SynthesizeStart().event())
        chunk = "word " * 100  # no sentence end: nothing is spoken yet, the text only piles up
        for _ in range(limit // len(chunk) + 20):
            await client.write_event(SynthesizeChunk(text=chunk).event())
        refused = await asyncio.wait_for(client.read_event(), timeout=30)
        assert refused is not None and refused.type == "error" and "tts_max_streamed_chars" in refused.data["text"]
        await client.write_event(SynthesizeStop().event())
        samples = 0
        async with asyncio.timeout(120):
            while (event := await client.read_event()) is not None and event.type != "synthesize-stopped":
                assert event.type != "error", event
                if event.type == "audio-chunk":
                    samples += len(AudioChunk.from_event(event).audio) // 2
        assert event is not None and event.type == "synthesize-stopped"
        # 50 words ("word" x 50): a few seconds to 25 s of speech, not 20 times that.
        assert 0 < samples < 25 * 22050, samples
        await client.disconnect()
    finally:
        await server.aclose()


async def test_a_stream_that_reaches_its_bound_exactly_is_told_when_more_comes(
    base_settings: Settings, asr_service: AsrService, tts_service: TtsService
) -> None:
    """A piece that ends exactly at tts_max_streamed_chars is spoken; the next is dropped and said so
    (a review: it was dropped silently). An answer of emoji alone streamed gets 100 ms of silence, as
    synthesize does (a review: no audio at all)."""
    first = "Hello there."
    settings = base_settings.model_copy(update={"tts_max_streamed_chars": len(first)})
    server = WyomingServer(settings, asr_service, tts=tts_service)
    port = await server.start(HOST, 0)
    registry, labels = asr_service.metrics.registry, {"code": "text_too_long"}
    counted = registry.get_sample_value("mediaserver_wyoming_errors_total", labels) or 0.0
    try:
        client = await _client(port)
        for pieces, told in (([first, " And more."], True), (["👍", " 🎉"], False)):
            await client.write_event(SynthesizeStart().event())
            for piece in pieces:
                await client.write_event(SynthesizeChunk(text=piece).event())
            await client.write_event(SynthesizeStop().event())
            events: list[Event] = []
            async with asyncio.timeout(60):
                while (event := await client.read_event()) is not None and event.type != "synthesize-stopped":
                    events.append(event)
            kinds = [e.type for e in events]
            assert kinds.count("error") == (1 if told else 0), kinds
            assert kinds.count("audio-start") == 1 and "audio-chunk" in kinds, kinds
            if not told:  # nothing to read: 100 ms of silence
                [chunk] = [AudioChunk.from_event(e) for e in events if e.type == "audio-chunk"]
                assert len(chunk.audio) == 2 * chunk.rate // 10 and not any(chunk.audio)
        await client.disconnect()
    finally:
        await server.aclose()
    assert registry.get_sample_value("mediaserver_wyoming_errors_total", labels) == counted + 1
