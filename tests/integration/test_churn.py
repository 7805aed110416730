"""Leaks under churn (issue #14): many WebRTC, device WebSocket and OpenAI Realtime sessions (over
WebSocket, transcription and conversation, and WebRTC calls) opened and closed, half of them
abruptly (a TCP reset mid-stream; a WebRTC peer whose sockets simply go silent; an offer whose peer
never connects), then the server is back where it started: no session in the registry or the
gauge, no task and no file descriptor more than before."""

from __future__ import annotations

import asyncio
import base64
import gc
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import numpy as np
import pytest
import pytest_asyncio

from mediaserver.state import SESSIONS
from tests.conftest import Clip, LiveServer
from tests.faults import abort_ws, metric_samples, own_fds, server_errors
from tests.rtc_peer import Peer, connect, connect_call, make_offer

WS_CYCLES = 200
RTC_CYCLES = 30
REALTIME_WS_CYCLES = 40
CALL_CYCLES = 9
DEAD_PEER_S = 2.0
CONNECT_TIMEOUT_S = 2.0
PEER_CLOSE_S = 20.0  # one client peer's close (aiortc); the whole test takes about 26 s on 2 cores
# A client peer whose close hung, with that close: kept, so that neither is destroyed still pending in a
# later test on this worker, whose error check would fail on it (stop 59's last full run: test_fuzz_http).
_STUCK: list[object] = []


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def churn_server(server_factory: Callable[..., Any]) -> LiveServer:
    server: LiveServer = await server_factory(
        rtc_dead_peer_timeout_s=DEAD_PEER_S, rtc_connect_timeout_s=CONNECT_TIMEOUT_S, wyoming_enabled=False
    )
    return server


async def ws_cycle(server: LiveServer, http: aiohttp.ClientSession, pcm: bytes, abrupt: bool) -> None:
    ws = await http.ws_connect(f"{server.url}/api/ws/asr")
    await ws.send_json({"type": "start", "mode": "server_vad", "partials": True})
    ready = await ws.receive_json(timeout=30)
    assert ready["type"] == "ready" and ready["session_id"] in server.app[SESSIONS].ids()
    for offset in range(0, len(pcm), 3200):
        await ws.send_bytes(pcm[offset : offset + 3200])
    if abrupt:
        abort_ws(ws)
        await ws.close()
    else:
        await ws.send_json({"type": "ping"})
        while (await ws.receive_json(timeout=30))["type"] != "pong":
            pass
        await ws.close()


async def speak_then_leave(peer: Peer, kind: str, clip: Clip) -> Peer | None:
    """Half a second of ``clip`` on the peer's track, then it closes or vanishes (``kind``); a vanished
    peer is returned, to be closed by the caller once the server has let go of it."""
    peer.track.play(clip, silence_after_s=0.0)
    await asyncio.sleep(0.5)
    if kind == "closes":
        await peer.close()
        return None
    peer.vanish()
    return peer


async def rtc_cycle(server: LiveServer, kind: str, clip: Clip) -> Peer | None:
    if kind == "never connects":
        pc, sdp = await make_offer()
        await pc.close()
        async with (
            aiohttp.ClientSession() as http,
            http.post(f"{server.url}/api/rtc/asr", json={"type": "offer", "sdp": sdp}) as resp,
        ):
            assert resp.status == 200
        return None
    peer = await connect(server)
    peer.send("start", {"hands_free": True, "partials": True})
    await peer.next("log")
    return await speak_then_leave(peer, kind, clip)


async def realtime_ws_cycle(server: LiveServer, http: aiohttp.ClientSession, audio: str, n: int) -> None:
    """A Realtime session over WebSocket (transcription or conversation), some audio, then gone."""
    query = "intent=transcription" if n % 4 < 2 else "model=gpt-realtime"
    ws = await http.ws_connect(f"{server.url}/v1/realtime?{query}", max_msg_size=0)
    assert (await ws.receive_json(timeout=30))["type"] == "session.created"
    await ws.send_json({"type": "input_audio_buffer.append", "audio": audio})
    if n % 2:
        abort_ws(ws)
    await ws.close()


async def call_cycle(server: LiveServer, kind: str, clip: Clip) -> Peer | None:
    """An OpenAI Realtime call (/v1/realtime/calls) that closes, vanishes or never connects."""
    if kind == "never connects":
        pc, sdp = await make_offer()
        await pc.close()
        headers = {"Content-Type": "application/sdp"}
        async with (
            aiohttp.ClientSession() as http,
            http.post(f"{server.url}/v1/realtime/calls", data=sdp, headers=headers) as resp,
        ):
            assert resp.status == 201
        return None
    peer, _ = await connect_call(server, raw_sdp=True)
    await peer.next("session.created")
    return await speak_then_leave(peer, kind, clip)


async def settled(server: LiveServer, baseline_tasks: int, baseline_fds: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        gc.collect()
        state = (len(server.app[SESSIONS]), len(asyncio.all_tasks()), len(own_fds(server.port)))
        if state[0] == 0 and state[1] <= baseline_tasks and state[2] <= baseline_fds:
            return
        if time.monotonic() > deadline:
            raise AssertionError(
                f"sessions {state[0]} (want 0), tasks {state[1]} (baseline {baseline_tasks}), "
                f"fds {state[2]} (baseline {baseline_fds})"
            )
        await asyncio.sleep(0.2)


async def test_ws_and_rtc_churn_leaves_nothing_behind(
    churn_server: LiveServer, caplog: pytest.LogCaptureFixture, speech: Callable[[str], Clip]
) -> None:
    clip = speech("Turn on the lights.")
    pcm = clip.pcm16k_bytes
    async with aiohttp.ClientSession() as http:
        # Warm up (first-use allocations: codecs, the session reaper), then take the baseline.
        await ws_cycle(churn_server, http, pcm, abrupt=False)
        await rtc_cycle(churn_server, "closes", clip)
        await settled(churn_server, 10**6, 10**6, 15)
        await asyncio.sleep(0.5)
        gc.collect()
        baseline_tasks, baseline_fds = len(asyncio.all_tasks()), len(own_fds(churn_server.port))

        started = time.monotonic()
        for batch in range(0, WS_CYCLES, 10):
            await asyncio.gather(*(ws_cycle(churn_server, http, pcm, abrupt=(batch + i) % 2 == 1) for i in range(10)))
        audio24k = base64.b64encode(np.repeat(np.frombuffer(pcm, "<i2"), 3)[::2].tobytes()).decode()  # 16 → 24 kHz
        for batch in range(0, REALTIME_WS_CYCLES, 8):
            await asyncio.gather(*(realtime_ws_cycle(churn_server, http, audio24k, batch + i) for i in range(8)))
        ws_s = time.monotonic() - started

    started = time.monotonic()
    kinds = ["closes", "vanishes", "never connects"]
    vanished: list[Peer] = []
    for batch in range(0, RTC_CYCLES, 6):
        peers = await asyncio.gather(*(rtc_cycle(churn_server, kinds[(batch + i) % 3], clip) for i in range(6)))
        vanished += [p for p in peers if p is not None]
    for batch in range(0, CALL_CYCLES, 3):
        peers = await asyncio.gather(*(call_cycle(churn_server, kinds[(batch + i) % 3], clip) for i in range(3)))
        vanished += [p for p in peers if p is not None]
    await settled_sessions(churn_server, DEAD_PEER_S + CONNECT_TIMEOUT_S + 10)
    rtc_s = time.monotonic() - started
    for peer in vanished:  # the client side of the vanished peers, now that the server has reaped them
        # Bounded: once in a full CI-like run, aiortc's own close of such a peer hung until the test's
        # 180 s timeout, and the test's task, destroyed pending, failed the next test's error check.
        closing = asyncio.ensure_future(peer.close())
        done, _ = await asyncio.wait({closing}, timeout=PEER_CLOSE_S)
        if not done:
            _STUCK.extend((peer, closing))
            pytest.fail(f"the test's own aiortc peer (vanished) did not close within {PEER_CLOSE_S:g} s")

    await settled(churn_server, baseline_tasks, baseline_fds, 15)
    samples = await metric_samples(churn_server.url)
    assert samples[("mediaserver_sessions", ())] == 0
    print(
        f"{WS_CYCLES} device and {REALTIME_WS_CYCLES} Realtime WebSocket cycles in {ws_s:.1f} s, "
        f"{RTC_CYCLES} WebRTC and {CALL_CYCLES} Realtime call cycles reaped in {rtc_s:.1f} s"
    )
    assert server_errors(caplog) == []


async def settled_sessions(server: LiveServer, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while len(server.app[SESSIONS]):
        assert time.monotonic() < deadline, f"{len(server.app[SESSIONS])} sessions left: {server.app[SESSIONS].ids()}"
        await asyncio.sleep(0.1)
