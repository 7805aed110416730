"""The device stream WebSocket (/api/ws/asr) with a real aiohttp client against a live server:
server VAD in real time with partials, push-to-talk in several formats, the query-string start,
every validation error, oversize frames, idle timeout, session cap and cleanup after a hang-up."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import numpy as np
import pytest

from mediaserver.state import SESSIONS
from tests.conftest import SENTENCES, Clip, LiveServer, resample_to
from tests.faults import abort_ws, tasks_ended

RATE = 16000
LONG_SENTENCE = "The old lighthouse keeper walked slowly along the rocky shore, and the seagulls followed him home."

Message = dict[str, Any]


def pcm16(audio: np.ndarray) -> bytes:
    return bytes((np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes())


def silence(seconds: float) -> np.ndarray:
    return np.zeros(int(RATE * seconds), np.float32)


class Client:
    """A WebSocket client whose messages are read in the background into a queue."""

    def __init__(self, http: aiohttp.ClientSession, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.http = http
        self.ws = ws
        self.messages: asyncio.Queue[Message | None] = asyncio.Queue()  # None: the socket closed
        self._reader = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        async for msg in self.ws:
            if msg.type == aiohttp.WSMsgType.TEXT:
                self.messages.put_nowait(json.loads(msg.data))
        self.messages.put_nowait(None)

    async def send(self, kind: str, **fields: Any) -> None:
        await self.ws.send_str(json.dumps({"type": kind, **fields}))

    async def next(self, timeout: float = 20.0) -> Message | None:
        return await asyncio.wait_for(self.messages.get(), timeout=timeout)

    async def until(self, kind: str, timeout: float = 20.0) -> list[Message]:
        """Every message up to and including the first of ``kind``."""
        deadline = time.monotonic() + timeout
        got: list[Message] = []
        while True:
            msg = await self.next(max(0.01, deadline - time.monotonic()))
            assert msg is not None, f"socket closed (code {self.ws.close_code}) while waiting for {kind}: {got}"
            got.append(msg)
            if msg["type"] == kind:
                return got

    async def start(self, **config: Any) -> Message:
        await self.send("start", **config)
        ready = (await self.until("ready"))[-1]
        assert ready["session_id"].startswith("ws-")
        return ready

    async def send_audio(self, data: bytes, frame_bytes: int, *, realtime_bytes_per_s: int | None = None) -> None:
        """Binary frames of ``frame_bytes``; paced like a microphone when ``realtime_bytes_per_s`` is set."""
        started = time.monotonic()
        for offset in range(0, len(data), frame_bytes):
            await self.ws.send_bytes(data[offset : offset + frame_bytes])
            if realtime_bytes_per_s:
                wait = started + (offset + frame_bytes) / realtime_bytes_per_s - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)

    async def closed(self, timeout: float = 10.0) -> int | None:
        """Wait for the server to close the socket; the close code."""
        deadline = time.monotonic() + timeout
        while (await self.next(max(0.01, deadline - time.monotonic()))) is not None:
            pass
        return self.ws.close_code


@asynccontextmanager
async def connect(server: LiveServer, query: str = "") -> AsyncIterator[Client]:
    async with aiohttp.ClientSession() as http:
        ws = await http.ws_connect(f"{server.url}/api/ws/asr{query}")
        client = Client(http, ws)
        try:
            yield client
        finally:
            await ws.close()
            await client._reader


async def push_to_talk(client: Client, clip: Clip, **config: Any) -> Message:
    await client.start(mode="push_to_talk", **config)
    await client.send_audio(clip.pcm16k_bytes, 3200)
    await client.send("stop")
    return (await client.until("final"))[-1]


async def check_streamed_partials(
    server: LiveServer, speech: Callable[[str], Clip], wer: Callable[[str, str], float]
) -> None:
    """A stream with partials through ``server`` (its ASR behind a remote backend, say), paced in real time:
    the partials' deltas are the start of the final, the final's delta the rest, and the final is right."""
    clip = speech(LONG_SENTENCE)
    async with connect(server) as ws:
        await ws.start(mode="server_vad", partials=True)
        await ws.send_audio(pcm16(np.concatenate([clip.audio16k, silence(1.2)])), 640, realtime_bytes_per_s=32000)
        got = await ws.until("final", timeout=60)
    partials = "".join(m["delta"] for m in got if m["type"] == "partial")
    final = got[-1]
    assert final["text"].startswith(partials) and partials + final["delta"] == final["text"]
    assert wer(LONG_SENTENCE, final["text"]) <= 0.25, final


async def gone(server: LiveServer, session_id: str, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while session_id in server.app[SESSIONS].ids() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return session_id not in server.app[SESSIONS].ids()


# --- server VAD -----------------------------------------------------------------------------------


async def test_server_vad_realtime_with_append_only_partials(
    server: LiveServer, speech: Callable[[str], Clip], wer: Callable[[str, str], float]
) -> None:
    clip = speech(LONG_SENTENCE)
    async with connect(server) as client:
        ready = await client.start(mode="server_vad", partials=True)
        assert ready == {
            "type": "ready",
            "session_id": ready["session_id"],
            "sample_rate": 16000,
            "encoding": "pcm16",
            "channels": 1,
            "mode": "server_vad",
            "partials": True,
            "unstable": False,
            "segments": False,
            "language": "en",
            "model": "tiny.en",
            "beam_size": 1,
            "task": "transcribe",
            "prompt": None,
            "noise_suppression": 0,
            "echo_cancellation": False,
            "wake": None,
            "turn_detection": "silence",  # in force: the server's default (server VAD mode reports it)
        }
        audio = pcm16(np.concatenate([silence(0.5), clip.audio16k, silence(1.2)]))
        await client.send_audio(audio, 640, realtime_bytes_per_s=2 * RATE)  # 20 ms frames in real time
        got = await client.until("final")
    kinds = [m["type"] for m in got]
    assert kinds[0] == "speech_started", kinds
    assert kinds.index("speech_stopped") < kinds.index("final")
    assert got[kinds.index("speech_stopped")]["discarded"] is False
    partials = [m for m in got if m["type"] == "partial"]
    assert partials, kinds
    streamed = "".join(p["delta"] for p in partials)
    assert streamed == partials[-1]["text"]
    final = got[-1]
    assert final["text"].startswith(streamed)
    assert streamed + final["delta"] == final["text"]
    assert wer(clip.text, final["text"]) <= 0.2, final
    assert final["language"] == "en"
    assert 0 < final["audio_start_ms"] < 1000 < final["audio_end_ms"]
    assert got[0]["audio_start_ms"] == final["audio_start_ms"]
    assert final["latency_ms"] > 0


async def test_unstable_partials_show_the_latest_guess_beside_the_promised_text(
    server: LiveServer, speech: Callable[[str], Clip], wer: Callable[[str, str], float]
) -> None:
    clip = speech(LONG_SENTENCE)
    async with connect(server) as client:
        ready = await client.start(mode="server_vad", partials=True, unstable=True)
        assert (ready["partials"], ready["unstable"]) == (True, True)
        audio = pcm16(np.concatenate([silence(0.5), clip.audio16k, silence(1.2)]))
        await client.send_audio(audio, 640, realtime_bytes_per_s=2 * RATE)
        got = await client.until("final")
    partials = [m for m in got if m["type"] == "partial"]
    assert partials and all(isinstance(p["unstable"], str) for p in partials), partials
    assert any(p["unstable"] for p in partials), partials  # guesses were shown
    # More messages than promised words: a partial goes out whenever the guess changes...
    assert len(partials) > sum(1 for p in partials if p["delta"])
    # ...and the promised text is still append-only, extended by the final.
    assert "".join(p["delta"] for p in partials) == partials[-1]["text"]
    final = got[-1]
    assert final["text"].startswith(partials[-1]["text"]) and wer(clip.text, final["text"]) <= 0.35, final


async def test_two_utterances_in_one_stream_give_two_finals_in_order(
    server: LiveServer, speech: Callable[[str], Clip], wer: Callable[[str, str], float]
) -> None:
    first, second = speech("kitchen"), speech("weather")
    audio = pcm16(np.concatenate([first.audio16k, silence(1.5), second.audio16k, silence(1.0)]))
    async with connect(server) as client:
        await client.start(mode="server_vad")
        await client.send_audio(audio, 1280)  # 40 ms frames, as fast as the socket takes them
        got = await client.until("final")
        got += await client.until("final")
    finals = [m for m in got if m["type"] == "final"]
    assert [m["type"] for m in got].count("speech_started") == 2
    assert wer(SENTENCES["kitchen"], finals[0]["text"]) <= 0.2, finals
    assert wer(SENTENCES["weather"], finals[1]["text"]) <= 0.2, finals
    assert finals[0]["audio_end_ms"] < finals[1]["audio_start_ms"]
    assert all(m["type"] != "partial" for m in got)  # partials are off by default


async def test_silence_gives_no_final(server: LiveServer, speech: Callable[[str], Clip]) -> None:
    """Nothing comes of 3 s of silence, proven by order rather than by waiting: the worker applies
    messages in order, so the pong answers only once the silence was heard and the stop applied;
    and speech after it gets events and a final of its own, with nothing before or between them."""
    clip = speech("kitchen")
    async with connect(server) as client:
        await client.start(mode="server_vad", partials=True)
        await client.send_audio(pcm16(silence(3.0)), 960)
        await client.send("stop")  # server VAD: flush an utterance in progress (there is none)
        await client.send("ping")
        got = await client.until("pong")  # pong comes after everything sent before it is processed
        assert [m["type"] for m in got] == ["pong"]
        await client.send_audio(pcm16(np.concatenate([silence(0.5), clip.audio16k, silence(1.0)])), 960)
        after = await client.until("final")
    kinds = [m["type"] for m in after]
    assert kinds[0] == "speech_started" and kinds.count("speech_started") == 1, kinds
    assert kinds.count("final") == 1 and set(kinds) <= {"speech_started", "partial", "speech_stopped", "final"}, kinds
    # Every event is the speech's, which starts 3.5 s in (the VAD keeps 150 ms before it).
    assert after[0]["audio_start_ms"] >= 3000 and after[-1]["audio_start_ms"] >= 3000, after


async def test_query_string_is_an_implicit_start(
    server: LiveServer, speech: Callable[[str], Clip], wer: Callable[[str, str], float]
) -> None:
    clip = speech("remind")
    query = "?sample_rate=16000&encoding=pcm16&mode=server_vad&partials=true&language=en"
    async with connect(server, query) as client:
        ready = await client.next()
        assert ready is not None and ready["type"] == "ready", ready
        assert (ready["mode"], ready["partials"], ready["language"]) == ("server_vad", True, "en")
        await client.send_audio(pcm16(np.concatenate([clip.audio16k, silence(1.0)])), 1280)
        final = (await client.until("final"))[-1]
    assert wer(clip.text, final["text"]) <= 0.2, final


async def test_bad_query_string_closes_with_policy_violation(server: LiveServer) -> None:
    async with connect(server, "?sample_rate=1000") as client:
        error = await client.next()
        assert error is not None
        assert (error["type"], error["code"], error["param"]) == ("error", "invalid_parameter", "sample_rate")
        assert await client.closed() == 1008


# --- push-to-talk -------------------------------------------------------------------------------


@pytest.mark.parametrize(("encoding", "rate", "channels"), [("pcm16", 16000, 1), ("float32", 48000, 2)])
async def test_push_to_talk_formats(
    server: LiveServer,
    speech: Callable[[str], Clip],
    wer: Callable[[str, str], float],
    encoding: str,
    rate: int,
    channels: int,
) -> None:
    clip = speech("garden")
    mono = resample_to(clip, rate).astype(np.float32)
    interleaved = np.repeat(mono, channels)
    data = interleaved.astype("<f4").tobytes() if encoding == "float32" else pcm16(interleaved)
    async with connect(server) as client:
        ready = await client.start(mode="push_to_talk", encoding=encoding, sample_rate=rate, channels=channels)
        assert (ready["encoding"], ready["sample_rate"], ready["channels"]) == (encoding, rate, channels)
        await client.send_audio(data, 8192)  # as fast as possible, frames of any size
        await client.send("stop")
        got = await client.until("final")
    assert [m["type"] for m in got] == ["final"]  # no speech events in push-to-talk
    final = got[0]
    assert wer(clip.text, final["text"]) <= 0.2, final
    assert final["delta"] == final["text"]
    assert final["audio_start_ms"] == 0
    assert abs(final["audio_end_ms"] - len(mono) * 1000 / rate) < 50


async def test_push_to_talk_restart_keeps_config_and_clear_drops_audio(
    server: LiveServer, speech: Callable[[str], Clip], wer: Callable[[str, str], float]
) -> None:
    async with connect(server) as client:
        final = await push_to_talk(client, speech("music"), model="base", beam_size=2, segments=True)
        assert wer(SENTENCES["music"], final["text"]) <= 0.2, final
        assert final["segments"] and "".join(s["text"] for s in final["segments"]).strip() == final["text"].strip()
        assert 0 <= final["segments"][0]["start_ms"] < final["segments"][-1]["end_ms"] <= final["audio_end_ms"] + 20
        again = await client.start()  # a bare start: a new utterance with the same config
        assert (again["mode"], again["model"], again["beam_size"], again["segments"]) == (
            "push_to_talk",
            "base",
            2,
            True,
        )
        await client.send_audio(speech("weather").pcm16k_bytes, 3200)
        await client.send("clear")
        await client.send_audio(speech("kitchen").pcm16k_bytes, 3200)
        await client.send("stop")
        final = (await client.until("final"))[-1]
        assert wer(SENTENCES["kitchen"], final["text"]) <= 0.2, final
        await client.send("stop")  # nothing is recording now
        error = (await client.until("error"))[-1]
        assert error["code"] == "not_recording"
        await client.start()
        await client.send("stop")  # an empty recording still gets its final
        final = (await client.until("final"))[-1]
        assert (final["text"], final["audio_end_ms"]) == ("", 0)
        await client.start()  # a stop right after a stop: its error comes after the first's final
        await client.send_audio(speech("weather").pcm16k_bytes, 3200)
        await client.send("stop")
        await client.send("stop")
        got = [m["type"] for m in await client.until("error")]
        assert "final" in got, got  # (the error ends the list: the final came first)


# --- bad input ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("send", "code", "param"),
    [
        (b"\x00\x01" * 160, "not_started", None),
        ("{not json", "invalid_message", None),
        ("[1, 2]", "invalid_message", None),
        ({"type": "hello"}, "unknown_type", None),
        ({"type": "stop"}, "not_started", None),
        ({"type": "interrupt"}, "not_started", None),
        ({"type": "reset"}, "not_started", None),
        ({"type": "start", "encoding": "mp3"}, "invalid_parameter", "encoding"),
        ({"type": "start", "sample_rate": 1000}, "invalid_parameter", "sample_rate"),
        ({"type": "start", "channels": 3}, "invalid_parameter", "channels"),
        ({"type": "start", "mode": "always"}, "invalid_parameter", "mode"),
        ({"type": "start", "language": "klingon"}, "invalid_parameter", "language"),
        ({"type": "start", "model": "tiny.en", "language": "de"}, "invalid_parameter", "language"),  # English-only
        ({"type": "start", "model": "nope"}, "model_not_found", "model"),
        ({"type": "start", "beam_size": 0}, "invalid_parameter", "beam_size"),
        ({"type": "start", "task": "summarize"}, "invalid_parameter", "task"),
        ({"type": "start", "prompt": {"x": 1}}, "invalid_parameter", "prompt"),  # (a trial's, once taken as text)
        ({"type": "start", "model": ["tiny.en"]}, "invalid_parameter", "model"),
        ("odd-length", "invalid_audio", None),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
async def test_bad_input_is_reported_and_the_session_kept(
    server: LiveServer,
    speech: Callable[[str], Clip],
    wer: Callable[[str, str], float],
    send: Any,
    code: str,
    param: str | None,
) -> None:
    async with connect(server) as client:
        if send == "odd-length":
            await client.start(mode="push_to_talk")
            await client.ws.send_bytes(b"\x00" * 321)
        elif isinstance(send, bytes):
            await client.ws.send_bytes(send)
        elif isinstance(send, str):
            await client.ws.send_str(send)
        else:
            await client.ws.send_str(json.dumps(send))
        error = (await client.until("error"))[-1]
        assert error["code"] == code, error
        assert error.get("param") == param, error
        assert error["message"]
        final = await push_to_talk(client, speech("kitchen"))
        assert wer(SENTENCES["kitchen"], final["text"]) <= 0.2, final


async def test_an_error_about_audio_comes_after_the_ready_of_the_start_before_it(server: LiveServer) -> None:
    """A start, then at once a frame that is not whole samples: a trial got the frame's
    ``invalid_audio`` before the start's ``ready``. Replies come in the order of the messages."""
    async with connect(server) as client:
        await client.ws.send_str(json.dumps({"type": "start", "mode": "push_to_talk"}))
        await client.ws.send_bytes(b"\x00" * 321)
        await client.ws.send_str(json.dumps({"type": "ping"}))
        kinds: list[str] = []
        while not kinds or kinds[-1] != "pong":
            message = await client.next()
            assert message is not None
            kinds.append(message["type"] if message["type"] != "error" else message["code"])
        assert kinds == ["ready", "invalid_audio", "pong"], kinds


async def test_oversize_message_closes_with_1009(server_factory: Callable[..., Any]) -> None:
    small: LiveServer = await server_factory(ws_max_message_bytes=4096)
    async with connect(small) as client:
        ready = await client.start(mode="push_to_talk")
        await client.ws.send_bytes(b"\x00" * 8192)
        assert await client.closed() == 1009
    assert await gone(small, ready["session_id"])


async def test_too_many_sessions_closes_with_1013(server_factory: Callable[..., Any]) -> None:
    capped: LiveServer = await server_factory(max_sessions=1)
    async with connect(capped) as first:
        await first.start()
        async with connect(capped) as second:
            error = await second.next()
            assert error is not None and (error["type"], error["code"]) == ("error", "too_many_sessions")
            assert await second.closed() == 1013
        assert len(capped.app[SESSIONS]) == 1


# --- lifecycle ------------------------------------------------------------------------------------


async def test_abrupt_disconnect_mid_utterance_leaves_nothing_behind(
    server: LiveServer, speech: Callable[[str], Clip]
) -> None:
    clip = speech(LONG_SENTENCE)
    async with connect(server) as client:
        session_id = (await client.start(mode="server_vad", partials=True))["session_id"]
        assert session_id in server.app[SESSIONS].ids()
        audio = pcm16(clip.audio16k[: int(RATE * 2.5)])  # hang up while speaking
        await client.send_audio(audio, 640, realtime_bytes_per_s=2 * RATE)
        assert (await client.until("speech_started"))[-1]
        assert any(session_id in t.get_name() for t in asyncio.all_tasks())  # the worker at least
        abort_ws(client.ws)
        assert await gone(server, session_id)
    await tasks_ended(session_id)


async def test_idle_session_is_closed(server_factory: Callable[..., Any]) -> None:
    idle: LiveServer = await server_factory(ws_idle_timeout_s=1, ws_heartbeat_s=0.25)  # pongs do not count
    async with connect(idle) as client:
        session_id = (await client.start())["session_id"]
        started = time.monotonic()
        error = await client.next(timeout=5)
        assert error is not None and error["code"] == "idle_timeout"
        assert await client.closed() == 4408
        assert 0.8 < time.monotonic() - started < 3.0
    assert await gone(idle, session_id)
