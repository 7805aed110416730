"""A client that goes away at every stage (issue #14): mid-upload, after the upload before the answer,
mid-stream, after ``stop`` before the final, mid-answer (the voice loop on WebRTC and the device
socket, OpenAI Realtime conversations over WebSocket and WebRTC calls, streamed chat completions and
speech), on every transport. Each time the server has let go of everything within 2 s (the session,
its tasks, queued ASR work, the LLM generation, the TTS sentences) and logged nothing at ERROR.

A WebRTC peer that closes says so (DTLS close, SCTP abort) and is gone at once; one that vanishes
without a word is found by the dead-peer watchdog (``rtc_dead_peer_timeout_s``, tested with a
killed process in test_hardening_streams.py)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import numpy as np
import pytest
import pytest_asyncio

from mediaserver.asr.engine import WhisperEngine
from mediaserver.asr.jobs import AsrJob, JobAbandoned
from mediaserver.asr.models import ModelRegistry
from mediaserver.asr.service import AsrService
from mediaserver.config import Settings
from mediaserver.devices import choose_device
from mediaserver.events import Transcript, TranscriptionOptions
from mediaserver.llm.service import LlmService
from mediaserver.metrics import Metrics
from mediaserver.state import ASR, METRICS, SESSIONS
from mediaserver.transport.wyoming.server import WYOMING_SERVER
from mediaserver.tts.service import TtsService
from tests.conftest import Clip, LiveServer
from tests.faults import abort_ws, eventually, requests_with_status, server_errors, session_tasks
from tests.integration.test_voice_loop import LONG_QUESTION, VOICE_SETTINGS, llm_busy, tts_open_streams
from tests.rtc_peer import Peer, connect, connect_call

CLEANUP_S = 2.0
SENTENCE = "Please remind me to call my mother tomorrow morning."


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def voice_server(server_factory: Callable[..., Any]) -> LiveServer:
    server: LiveServer = await server_factory(
        **{**VOICE_SETTINGS, "assistant_max_answer_tokens": 200, "wyoming_port": 0, "wyoming_host": "127.0.0.1"}
    )
    return server


async def _all_gone(server: LiveServer, session_id: str) -> float:
    """Seconds until the session left the registry and its tasks ended (fails past CLEANUP_S)."""
    return await eventually(
        lambda: session_id not in server.app[SESSIONS].ids() and not session_tasks(session_id), CLEANUP_S
    )


async def _new_session(server: LiveServer, before: set[str]) -> str:
    """The one session opened since ``before`` was taken."""
    (new,) = set(server.app[SESSIONS].ids()) - before
    return new


async def _answer_stopped(llm: LlmService, tts: TtsService) -> None:
    """Within CLEANUP_S the LLM generates nothing and no TTS stream is open (fails past it)."""
    await eventually(lambda: not llm_busy(llm) and tts_open_streams(tts) == 0, CLEANUP_S)


def _pcm(clip: Clip, silence_s: float = 0.0) -> bytes:
    audio = np.concatenate([clip.audio16k, np.zeros(int(16000 * silence_s), np.float32)])
    return bytes((np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes())


# --- HTTP ---------------------------------------------------------------------------------------------


async def test_http_hang_up_after_the_upload_before_the_answer(
    voice_server: LiveServer, caplog: pytest.LogCaptureFixture, speech: Callable[[str], Clip]
) -> None:
    """The handler is cancelled, so its transcription leaves the queue instead of running for nobody."""
    body = _pcm(speech(SENTENCE))
    registry = voice_server.app[METRICS].registry

    def received() -> float:
        return registry.get_sample_value("mediaserver_audio_seconds_total", {"route": "willow"}) or 0.0

    received_before = received()
    before = await requests_with_status(voice_server.url, 499)
    _, writer = await asyncio.open_connection(voice_server.host, voice_server.port)
    writer.write(f"POST /api/willow HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
    await writer.drain()
    # The server has the whole utterance and is transcribing it: now the device gives up.
    await eventually(lambda: received() > received_before, 10, interval_s=0.005)
    writer.transport.abort()
    started = time.monotonic()
    while await requests_with_status(voice_server.url, 499) <= before:
        assert time.monotonic() - started < CLEANUP_S, "the hang-up was not noticed"
        await asyncio.sleep(0.05)
    await eventually(lambda: voice_server.app[ASR].open_jobs() == 0, CLEANUP_S)
    assert server_errors(caplog) == []


async def test_http_hang_up_while_the_llm_answers(
    voice_server: LiveServer, caplog: pytest.LogCaptureFixture, llm_service: LlmService
) -> None:
    """A long non-streamed completion: the generation stops when the client leaves, not 1000 tokens later."""
    body = json.dumps(
        {"model": "gpt-4o-mini", "max_tokens": 1000, "messages": [{"role": "user", "content": LONG_QUESTION}]}
    ).encode()
    head = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    head += f"Content-Length: {len(body)}\r\n\r\n"
    _, writer = await asyncio.open_connection(voice_server.host, voice_server.port)
    writer.write(head.encode() + body)
    await writer.drain()
    await eventually(lambda: llm_busy(llm_service), 30, interval_s=0.01)
    writer.transport.abort()
    await eventually(lambda: not llm_busy(llm_service), CLEANUP_S)
    assert server_errors(caplog) == []


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/audio/speech"])
async def test_http_hang_up_mid_streamed_answer(
    voice_server: LiveServer,
    caplog: pytest.LogCaptureFixture,
    llm_service: LlmService,
    tts_service: TtsService,
    path: str,
) -> None:
    """A streamed answer (server-sent chat deltas; speech audio sentence by sentence): the client reads
    the first bytes and goes away; the generation or the synthesis stops."""
    if path == "/v1/chat/completions":
        request: dict[str, Any] = {
            "model": "gpt-4o-mini",
            "max_tokens": 1000,
            "stream": True,
            "messages": [{"role": "user", "content": LONG_QUESTION}],
        }
    else:
        request = {"model": "tts-1", "voice": "alloy", "input": " ".join([SENTENCE, LONG_QUESTION] * 8)}
    body = json.dumps(request).encode()
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    reader, writer = await asyncio.open_connection(voice_server.host, voice_server.port)
    writer.write(head.encode() + body)
    await writer.drain()
    received = b""
    async with asyncio.timeout(60):
        while b"\r\n\r\n" not in received or len(received) < received.index(b"\r\n\r\n") + 200:
            received += await reader.read(4096)  # the headers and the first of the answer
    assert received.startswith(b"HTTP/1.1 200"), received[:200]
    writer.transport.abort()
    await _answer_stopped(llm_service, tts_service)
    assert server_errors(caplog) == []


# --- device WebSocket ----------------------------------------------------------------------------------


async def _ws_open(server: LiveServer, http: aiohttp.ClientSession, **start: Any) -> tuple[Any, str]:
    ws = await http.ws_connect(f"{server.url}/api/ws/asr")
    await ws.send_json({"type": "start", **start})
    while (msg := await ws.receive_json(timeout=10))["type"] != "ready":
        pass
    return ws, str(msg["session_id"])


async def _ws_until(ws: Any, kind: str, timeout: float = 60) -> dict[str, Any]:
    async with asyncio.timeout(timeout):
        while True:
            msg = await ws.receive()
            if msg.type == aiohttp.WSMsgType.TEXT and (event := msg.json())["type"] == kind:
                return dict(event)


@pytest.mark.parametrize("stage", ["mid-stream", "after stop before the final"])
async def test_device_socket_hang_ups(
    voice_server: LiveServer, caplog: pytest.LogCaptureFixture, speech: Callable[[str], Clip], stage: str
) -> None:
    pcm = _pcm(speech(SENTENCE))
    async with aiohttp.ClientSession() as http:
        if stage == "mid-stream":
            ws, session_id = await _ws_open(voice_server, http, mode="server_vad", partials=True)
            for offset in range(0, len(pcm) // 2, 640):
                await ws.send_bytes(pcm[offset : offset + 640])
            await _ws_until(ws, "speech_started")
        else:
            ws, session_id = await _ws_open(voice_server, http, mode="push_to_talk")
            await ws.send_bytes(pcm)
            await ws.send_json({"type": "stop"})
            await eventually(lambda: voice_server.app[ASR].open_jobs() > 0, 10, 0.005)  # the final is being made
        abort_ws(ws)
        await _all_gone(voice_server, session_id)
    await eventually(lambda: voice_server.app[ASR].open_jobs() == 0, CLEANUP_S)
    assert server_errors(caplog) == []


async def test_device_socket_hang_up_mid_answer(
    voice_server: LiveServer,
    caplog: pytest.LogCaptureFixture,
    speech: Callable[[str], Clip],
    llm_service: LlmService,
    tts_service: TtsService,
) -> None:
    async with aiohttp.ClientSession() as http:
        ws, session_id = await _ws_open(voice_server, http, mode="server_vad", assistant=True)
        await ws.send_bytes(_pcm(speech(LONG_QUESTION), silence_s=1.0))
        await _ws_until(ws, "assistant_audio_started")  # the answer is being spoken (and still written)
        abort_ws(ws)
        await _all_gone(voice_server, session_id)
    await _answer_stopped(llm_service, tts_service)
    assert server_errors(caplog) == []


# --- WebRTC -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("stage", ["mid-stream", "after stop before the final"])
async def test_rtc_hang_ups(
    voice_server: LiveServer, caplog: pytest.LogCaptureFixture, speech: Callable[[str], Clip], stage: str
) -> None:
    before = set(voice_server.app[SESSIONS].ids())
    peer: Peer = await connect(voice_server)
    try:
        session_id = await _new_session(voice_server, before)
        if stage == "mid-stream":
            peer.send("start", {"hands_free": True, "partials": True})
            await peer.next("log")
            peer.track.play(speech(SENTENCE))
            await peer.next("speech_started", timeout=30)
        else:
            peer.send("start")
            await peer.next("log")
            duration = peer.track.play(speech("Turn on the lights."), silence_after_s=0.2)
            await asyncio.sleep(duration)
            peer.send("stop")
            await peer.next("log")  # "Doing ASR ..." : the final is being made
    finally:
        await peer.close()
    await _all_gone(voice_server, session_id)
    await eventually(lambda: voice_server.app[ASR].open_jobs() == 0, CLEANUP_S)
    assert server_errors(caplog) == []


async def test_rtc_hang_up_mid_answer(
    voice_server: LiveServer,
    caplog: pytest.LogCaptureFixture,
    speech: Callable[[str], Clip],
    llm_service: LlmService,
    tts_service: TtsService,
) -> None:
    before = set(voice_server.app[SESSIONS].ids())
    peer = await connect(voice_server)
    try:
        session_id = await _new_session(voice_server, before)
        peer.send("start", {"hands_free": True, "assistant": True, "system_prompt": "You tell long stories."})
        await peer.next("log")
        peer.track.play(speech(LONG_QUESTION), silence_after_s=1.0)
        await peer.next("assistant_audio_started", timeout=60)
    finally:
        await peer.close()
    await _all_gone(voice_server, session_id)
    await _answer_stopped(llm_service, tts_service)
    assert server_errors(caplog) == []


# --- Realtime and Wyoming ------------------------------------------------------------------------------


async def test_realtime_hang_up_mid_stream(
    voice_server: LiveServer, caplog: pytest.LogCaptureFixture, speech: Callable[[str], Clip]
) -> None:
    import base64

    before = set(voice_server.app[SESSIONS].ids())
    clip = speech(SENTENCE)
    pcm24 = np.interp(np.arange(0, clip.audio16k.size, 16000 / 24000), np.arange(clip.audio16k.size), clip.audio16k)
    audio = (np.clip(pcm24, -1, 1) * 32767).astype("<i2").tobytes()
    async with aiohttp.ClientSession() as http:
        ws = await http.ws_connect(f"{voice_server.url}/v1/realtime?intent=transcription", max_msg_size=0)
        session_id = await _new_session(voice_server, before)
        for offset in range(0, len(audio) // 2, 4800):
            chunk = base64.b64encode(audio[offset : offset + 4800]).decode()
            await ws.send_json({"type": "input_audio_buffer.append", "audio": chunk})
        await _ws_until(ws, "input_audio_buffer.speech_started")
        abort_ws(ws)
        await _all_gone(voice_server, session_id)
    assert server_errors(caplog) == []


async def test_realtime_conversation_hang_up_mid_answer(
    voice_server: LiveServer, caplog: pytest.LogCaptureFixture, llm_service: LlmService, tts_service: TtsService
) -> None:
    before = set(voice_server.app[SESSIONS].ids())
    async with aiohttp.ClientSession() as http:
        ws = await http.ws_connect(f"{voice_server.url}/v1/realtime?model=gpt-realtime", max_msg_size=0)
        session_id = await _new_session(voice_server, before)
        await ws.send_json({"type": "session.update", "session": {"type": "realtime", "instructions": "Tell stories."}})
        user = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": LONG_QUESTION}]}
        await ws.send_json({"type": "conversation.item.create", "item": user})
        await ws.send_json({"type": "response.create"})
        await _ws_until(ws, "response.output_audio.delta")  # the answer is being spoken (and still written)
        abort_ws(ws)
        await _all_gone(voice_server, session_id)
    await _answer_stopped(llm_service, tts_service)
    assert server_errors(caplog) == []


async def test_realtime_call_hang_up_mid_answer(
    voice_server: LiveServer,
    caplog: pytest.LogCaptureFixture,
    speech: Callable[[str], Clip],
    llm_service: LlmService,
    tts_service: TtsService,
) -> None:
    peer, location = await connect_call(voice_server, raw_sdp=True)
    session_id = location.rsplit("/", 1)[1]
    try:
        await peer.next("session.created")
        peer.track.play(speech(LONG_QUESTION), silence_after_s=1.0)
        await peer.next("output_audio_buffer.started", timeout=60)  # the answer plays on the track
    finally:
        await peer.close()
    await _all_gone(voice_server, session_id)
    await _answer_stopped(llm_service, tts_service)
    assert server_errors(caplog) == []


async def test_wyoming_hang_up_after_audio_stop(
    voice_server: LiveServer, caplog: pytest.LogCaptureFixture, speech: Callable[[str], Clip]
) -> None:
    wyoming = voice_server.app[WYOMING_SERVER]
    assert wyoming.port is not None
    pcm = _pcm(speech(SENTENCE))
    fmt = b'{"rate": 16000, "width": 2, "channels": 1}'
    _, writer = await asyncio.open_connection("127.0.0.1", wyoming.port)
    writer.write(b'{"type": "transcribe", "data": {"language": "en"}}\n')
    writer.write(b'{"type": "audio-start", "data": ' + fmt + b"}\n")
    for offset in range(0, len(pcm), 2048):
        payload = pcm[offset : offset + 2048]
        writer.write(b'{"type": "audio-chunk", "data": ' + fmt + b', "payload_length": %d}\n' % len(payload) + payload)
    writer.write(b'{"type": "audio-stop"}\n')
    await writer.drain()
    await eventually(lambda: voice_server.app[ASR].open_jobs() > 0, 10, 0.005)  # the transcript is being made
    writer.transport.abort()
    await eventually(lambda: not wyoming.connections and wyoming.budget.used_bytes == 0, CLEANUP_S)
    assert server_errors(caplog) == []


async def test_a_long_upload_whose_caller_left_stops_between_decoder_calls(
    base_settings: Settings, human_clips: list[tuple[str, np.ndarray, str]]
) -> None:
    """An operator trial: a client hung up 3 s into a 150 s upload, and the server decoded it for 40
    more seconds (its windows in one generate call, then every loop guard's redecode), holding the
    ASR thread and a SIGTERM. The job's windows now go in calls of ``asr_max_batch`` (here 1, its
    setting at a non-default value), and those of a job nobody waits for are not decoded."""
    settings = base_settings.model_copy(update={"asr_preload_models": ["tiny.en"], "asr_max_batch": 1})
    service = AsrService(settings, choose_device("cpu", "auto", 0), ModelRegistry(settings), Metrics())
    await service.start()
    try:
        counters = (await service.get_model("tiny.en")).engine.counters
        planned = counters["windows"]
        audio = np.concatenate([clip for _, clip, _ in human_clips] * 3)  # about 200 s of real speech
        task = asyncio.create_task(service.transcribe(audio, TranscriptionOptions()))
        await eventually(lambda: counters["windows"] > planned, 60, interval_s=0.01)  # decoding has begun
        windows = counters["windows"] - planned
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await eventually(lambda: counters["abandoned"] > 0, 60)
        abandoned = counters["abandoned"]
        assert 0 < abandoned < windows, (abandoned, windows)
        # The thread is free again: a short job is answered.
        short = await service.transcribe(human_clips[0][1], TranscriptionOptions())
        assert short.text
    finally:
        await service.aclose()


async def test_a_caller_leaving_mid_decode_ends_only_its_own_job(
    asr_service: AsrService, human_clips: list[tuple[str, np.ndarray, str]], caplog: pytest.LogCaptureFixture
) -> None:
    """Two jobs in one batch; the caller of the long one (word timestamps: faster-whisper's own loop)
    goes while it is decoded. That job ends there, the other's transcript stands, and nothing is
    logged as an error (a review: an abandoned redecode failed its whole batch)."""
    engine = (await asr_service.get_model("tiny.en")).engine
    assert isinstance(engine, WhisperEngine)
    long_audio = np.concatenate([clip for _, clip, _ in human_clips])  # about 66 s
    gone = threading.Event()
    long_job = AsrJob(long_audio, TranscriptionOptions(word_timestamps=True), abandoned=gone)
    short_job = AsrJob(human_clips[0][1], TranscriptionOptions())
    timer = threading.Timer(0.5, gone.set)
    timer.start()
    try:
        results = await asyncio.to_thread(engine.transcribe_batch, [long_job, short_job])
    finally:
        timer.cancel()
    assert isinstance(results[0], JobAbandoned), results[0]
    assert isinstance(results[1], Transcript) and results[1].text, results[1]
    assert server_errors(caplog) == []


async def test_a_long_upload_whose_caller_left_runs_no_window_fallback_for_nobody(
    asr_service: AsrService, speech: Callable[[str], Clip]
) -> None:
    """A trial: a 5-minute upload of one sentence said over and over (each 30 s window compresses
    like a loop, so each goes through Whisper's temperature fallback, ~6 s a window), hung up on
    1.5 s in: the server went on with every window's fallback for 40 s, and a 1.4 s request behind
    it waited 48 s. Once its caller has gone, a decoded window's fallback or redo is not run."""
    engine = (await asr_service.get_model("tiny.en")).engine
    assert isinstance(engine, WhisperEngine)
    sentence = speech("kitchen").audio16k.astype(np.float32)
    audio = np.concatenate([np.concatenate([sentence, np.zeros(16000, np.float32)])] * 60)  # ~2.5 min
    gone = threading.Event()
    original = engine._decoder.run

    def first_call_then_gone(windows: Any) -> Any:
        outputs = original(windows)
        gone.set()  # the caller hangs up while the first windows were being decoded
        return outputs

    engine._decoder.run = first_call_then_gone  # type: ignore[method-assign]
    before = dict(engine.counters)
    try:
        [result] = await asyncio.to_thread(
            engine.transcribe_batch, [AsrJob(audio, TranscriptionOptions(), abandoned=gone)]
        )
    finally:
        del engine._decoder.run
    assert isinstance(result, JobAbandoned), result
    assert engine.counters["window_fallbacks"] == before["window_fallbacks"]
    assert engine.counters["sequential"] == before["sequential"]
