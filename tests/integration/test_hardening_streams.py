"""Regression tests of issue #14 on the streaming side: deeply nested JSON on the device WebSocket and
the WebRTC data channel is an error event and the session goes on; a WebSocket message of exactly
``ws_max_message_bytes`` is accepted (compressed or not); a WebRTC peer that vanishes (its process
killed) is reaped within ``rtc_dead_peer_timeout_s``, a quiet live one is not, and an offer that never
connects gives its slot back after ``rtc_connect_timeout_s``."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import websockets

from mediaserver.asr.service import AsrService
from mediaserver.config import Settings
from mediaserver.errors import Overloaded
from mediaserver.events import TranscriptionOptions
from mediaserver.state import SESSIONS
from mediaserver.transport.openai.realtime.calls import RealtimeCall
from mediaserver.transport.openai.realtime.session import max_message_bytes
from mediaserver.transport.rtc_peer.patches import quiet_idle_reports
from mediaserver.transport.webrtc.asr import RtcSession
from tests.conftest import LiveServer
from tests.faults import eventually, server_errors
from tests.rtc_peer import connect, connect_call, make_offer

NESTED = "[" * 5000 + "]" * 5000
REPO = Path(__file__).resolve().parents[2]


async def _ws_next(ws: aiohttp.ClientWebSocketResponse, timeout: float = 10) -> dict[str, Any]:
    msg = await ws.receive(timeout=timeout)
    assert msg.type == aiohttp.WSMsgType.TEXT, (msg.type, msg.data, ws.close_code)
    result: dict[str, Any] = json.loads(msg.data)
    return result


# --- 4. deeply nested JSON ------------------------------------------------------------------------------


async def test_nested_json_on_the_device_socket_is_invalid_message_and_the_session_goes_on(
    server: LiveServer, caplog: pytest.LogCaptureFixture
) -> None:
    async with aiohttp.ClientSession() as http, http.ws_connect(f"{server.url}/api/ws/asr") as ws:
        await ws.send_json({"type": "start"})
        ready = await _ws_next(ws)
        for bad in (NESTED, '{"type": "start", "model": ' + NESTED + "}"):
            await ws.send_str(bad)
            error = await _ws_next(ws)
            assert error["type"] == "error" and error["code"] == "invalid_message", error
        await ws.send_json({"type": "ping"})
        assert (await _ws_next(ws))["type"] == "pong"
        assert ready["session_id"] in server.app[SESSIONS].ids()  # the same session
    assert server_errors(caplog) == []


async def test_nested_json_on_the_data_channel_is_an_error_and_the_session_goes_on(
    server: LiveServer, caplog: pytest.LogCaptureFixture
) -> None:
    peer = await connect(server)
    try:
        peer.channel.send(NESTED)
        error = await peer.next(timeout=10)
        assert error == {"type": "error", "message": "could not parse message", "obj": None}
        peer.send("ping", message="still there")
        assert (await peer.next("pong", timeout=10))["message"] == "still there"
    finally:
        await peer.close()
    assert server_errors(caplog) == []  # no "Task exception was never retrieved"


async def test_an_utterance_that_cannot_be_transcribed_is_an_error_naming_its_audio_on_the_data_channel(
    server: LiveServer, asr_service: AsrService, speech: Any
) -> None:
    """With extensions on, a failed utterance's ``error`` carries its code and audio times and stands
    in for its ``infer`` (as on the device socket), so a client can tell which utterance was lost.
    The failure is a real one: the shared ASR queue is kept full of file jobs."""
    scheduler = (await asr_service.get_model(None)).scheduler
    filler = speech("story").audio16k  # real speech, quick to decode: the queue refills within ms
    stop = asyncio.Event()

    async def fill() -> None:
        while not stop.is_set():
            try:
                await asr_service.transcribe(filler, TranscriptionOptions(language="en"))
            except Overloaded:
                await asyncio.sleep(0.005)

    fillers = [asyncio.create_task(fill()) for _ in range(scheduler._max_queue + 16)]
    peer = await connect(server)
    try:
        peer.send("start", {"hands_free": True})
        await peer.next("log")
        await eventually(lambda: scheduler._queue.qsize() >= scheduler._max_queue, timeout_s=10)
        peer.track.play(speech("kitchen"), silence_after_s=1.0)
        got = [await peer.next(timeout=30)]
        while got[-1]["type"] != "error":
            got.append(await peer.next(timeout=30))
        # No infer for it, before or after the error: stop is answered after all the session sent before.
        peer.send("stop")
        while got[-1] != {"type": "log", "message": "ASR hands-free - stopped", "obj": None}:
            got.append(await peer.next(timeout=30))
        kinds = [m["type"] for m in got]
        assert "infer" not in kinds, got
        started = got[kinds.index("speech_started")]
        stopped = got[kinds.index("speech_stopped")]
        error = got[kinds.index("error")]
    finally:
        stop.set()
        for task in fillers:
            task.cancel()
        await asyncio.gather(*fillers, return_exceptions=True)
        await peer.close()
    assert scheduler.depth == 0  # the withdrawn fillers take no room from the next client
    assert error["obj"] == {
        "code": "overloaded",
        "audio_start_ms": started["obj"]["ms"],
        "audio_end_ms": stopped["obj"]["ms"],
    }, error
    assert "overloaded" in error["message"]


# --- 7. a message of exactly ws_max_message_bytes -------------------------------------------------------

LIMIT = 4096


def _ping_of(size: int) -> str:
    text = '{"type": "ping"}'
    return text + " " * (size - len(text))


async def test_a_message_of_exactly_the_limit_is_accepted_one_more_byte_is_1009(server_factory: Any) -> None:
    small: LiveServer = await server_factory(ws_max_message_bytes=LIMIT, wyoming_enabled=False)
    async with aiohttp.ClientSession() as http:
        async with http.ws_connect(f"{small.url}/api/ws/asr") as ws:
            await ws.send_str(_ping_of(LIMIT))
            assert (await _ws_next(ws))["type"] == "pong"
            await ws.send_json({"type": "start", "mode": "push_to_talk"})
            assert (await _ws_next(ws))["type"] == "ready"
            await ws.send_bytes(bytes(LIMIT))  # audio: exactly the limit
            await ws.send_json({"type": "ping"})
            assert (await _ws_next(ws))["type"] == "pong"
        for oversize in (_ping_of(LIMIT + 1), bytes(LIMIT + 1)):
            async with http.ws_connect(f"{small.url}/api/ws/asr") as ws:
                await (ws.send_str(oversize) if isinstance(oversize, str) else ws.send_bytes(oversize))
                msg = await ws.receive(timeout=10)
                assert msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED), msg
                assert ws.close_code == 1009
    # A client that compresses (permessage-deflate, what websockets offers by default): the limit is on
    # the message itself, not on its compressed frame.
    uri = small.url.replace("http://", "ws://") + "/api/ws/asr"
    async with websockets.connect(uri, max_size=None) as client:
        await client.send(_ping_of(LIMIT))
        assert json.loads(await asyncio.wait_for(client.recv(), 10))["type"] == "pong"
        await client.send(_ping_of(LIMIT + 1))
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await asyncio.wait_for(client.recv(), 10)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009


async def test_realtime_takes_a_message_of_exactly_its_limit(server: LiveServer) -> None:
    """The same rule on /v1/realtime, whose limit is never below one full audio append (~22 MB)."""
    limit = max_message_bytes(server.app[SESSIONS].settings)
    event = '{"type": "no.such.event"}'
    async with (
        aiohttp.ClientSession() as http,
        http.ws_connect(f"{server.url}/v1/realtime?intent=transcription", max_msg_size=0) as ws,
    ):
        assert (await _ws_next(ws))["type"] == "session.created"
        await ws.send_str(event + " " * (limit - len(event)))
        error = await _ws_next(ws, timeout=30)
        assert error["type"] == "error" and error["error"]["code"] == "invalid_value", error
    uri = server.url.replace("http://", "ws://") + "/v1/realtime?intent=transcription"
    async with websockets.connect(uri, max_size=None, compression=None) as client:
        with pytest.raises(websockets.ConnectionClosed) as closed:  # while sending or after
            await client.send(event + " " * (limit + 1 - len(event)))
            await asyncio.wait_for(client.recv(), 30)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009
        assert closed.value.rcvd.reason == f"message too big: at most {limit} bytes per message"


# --- 8. dead peers and offers that never connect --------------------------------------------------------


async def test_a_killed_peer_is_reaped_within_the_dead_peer_timeout(
    server: LiveServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A real aiortc client in its own process, killed with SIGKILL: no DTLS close, no SCTP abort, no
    RTCP BYE, it simply stops. Without the watchdog this took 30-34 s (ICE consent expiry)."""
    timeout_s = server.app[SESSIONS].settings.rtc_dead_peer_timeout_s
    assert 0 < timeout_s <= 5
    before = set(server.app[SESSIONS].ids())
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        str(REPO / "tests" / "rtc_peer_process.py"),
        server.url,
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert child.stdout is not None
        line = await asyncio.wait_for(child.stdout.readline(), timeout=60)
        assert line.strip() == b"ready", line
        new = set(server.app[SESSIONS].ids()) - before
        assert len(new) == 1
        session = server.app[SESSIONS].get(next(iter(new)))
        assert isinstance(session, RtcSession)
        await eventually(lambda: session.stream.samples_received >= 16000, 30)  # connected, 1 s of audio heard
    finally:
        child.send_signal(signal.SIGKILL)
        await child.wait()
    killed_at = time.monotonic()
    took = await eventually(lambda: not set(server.app[SESSIONS].ids()) & new, timeout_s + 3)
    print(f"dead peer reaped {took:.1f} s after SIGKILL (rtc_dead_peer_timeout_s={timeout_s:g})")
    assert time.monotonic() - killed_at >= timeout_s * 0.9  # not before the timeout: a quiet peer is no dead peer
    assert server_errors(caplog) == []


async def test_a_vanished_realtime_call_is_reaped_within_the_dead_peer_timeout(
    server_factory: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The same watchdog on OpenAI Realtime calls (/v1/realtime/calls): without it a call whose peer
    vanished held its session, its conversation and its tracks until ICE consent expired (30-34 s)."""
    timeout_s = 2.0
    quick: LiveServer = await server_factory(rtc_dead_peer_timeout_s=timeout_s, wyoming_enabled=False)
    peer, location = await connect_call(quick)
    call_id = location.rsplit("/", 1)[1]
    try:
        await peer.next("session.created", timeout=10)
        call = quick.app[SESSIONS].get(call_id)
        assert isinstance(call, RealtimeCall)
        await eventually(lambda: call.session.stream.samples_received >= 8000, 30)  # connected, 0.5 s of audio heard
        peer.vanish()
        took = await eventually(lambda: call_id not in quick.app[SESSIONS].ids(), timeout_s + 3)
    finally:
        await peer.close()
    print(f"vanished call reaped after {took:.1f} s (rtc_dead_peer_timeout_s={timeout_s:g})")
    assert took >= timeout_s * 0.9
    await eventually(lambda: not [t for t in asyncio.all_tasks() if call_id in t.get_name()], 2)
    assert server_errors(caplog) == []


async def test_a_quiet_live_peer_is_kept(server_factory: Any) -> None:
    """Paused (no RTP), no data-channel messages, RTCP reports every 30 s (the client's own aiortc
    loops slowed as the server's are), and a dead-peer timeout shorter than aiortc's ICE consent
    interval (~5 s): only the watchdog's probe makes the peer speak, and it must keep the session."""
    quick: LiveServer = await server_factory(rtc_dead_peer_timeout_s=2.5, wyoming_enabled=False)
    before = set(quick.app[SESSIONS].ids())
    peer = await connect(quick)
    quiet_idle_reports(peer.pc, 30.0)
    try:
        new = set(quick.app[SESSIONS].ids()) - before
        await peer.pause()
        await asyncio.sleep(8)
        assert new <= set(quick.app[SESSIONS].ids())
        peer.send("ping", message="awake")
        assert (await peer.next("pong", timeout=10))["message"] == "awake"
    finally:
        await peer.close()


async def test_an_offer_that_never_connects_gives_its_slot_back(server_factory: Any) -> None:
    assert Settings().rtc_connect_timeout_s <= 10  # the default, down from 30 s
    quick: LiveServer = await server_factory(rtc_connect_timeout_s=1.5, wyoming_enabled=False)
    pc, sdp = await make_offer()
    await pc.close()  # the client is gone before ICE even starts
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{quick.url}/api/rtc/asr", json={"type": "offer", "sdp": sdp}) as resp,
    ):
        assert resp.status == 200
    assert len(quick.app[SESSIONS]) == 1
    took = await eventually(lambda: len(quick.app[SESSIONS]) == 0, 1.5 + 2)
    assert took >= 1.0
