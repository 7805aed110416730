"""Fuzzing the WebRTC transport, seeded and bounded: mangled SDP offers (captured aiortc and Chromium
offers, with and without a data channel, every audio direction: truncated after every line, every
line deleted, some duplicated, seeded mutations) to /api/rtc/asr and to OpenAI Realtime calls
(/v1/realtime/calls), and random control JSON on the data channel. Only documented answers may come
back (200/201 with an answer, or a 400 naming the SDP; ``error`` messages on the channel), nothing
is logged at ERROR, and a real session works right after."""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from mediaserver.state import ASR, SESSIONS
from tests.conftest import LiveServer
from tests.faults import eventually, fds_back_to, own_fds, server_errors
from tests.fuzzgen import control_messages, sdp_fixtures, sdp_mutations, sdp_sweeps
from tests.rtc_peer import connect, connect_call

SEED = 14
CONNECT_TIMEOUT_S = 1.0  # answered offers nobody connects to give their slot back quickly
FULL_SWEEPS = ("aiortc-sendrecv-datachannel", "chromium-sendrecv-datachannel")
DC_MESSAGE_TYPES = {"log", "error", "pong", "infer", "partial", "speech_started", "speech_stopped"}
DC_MESSAGE_TYPES |= {"assistant", "assistant_audio_started", "assistant_audio_stopped"}


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def fuzz_server(server_factory: Any) -> LiveServer:
    server: LiveServer = await server_factory(
        rtc_connect_timeout_s=CONNECT_TIMEOUT_S, max_sessions=5000, wyoming_enabled=False
    )
    return server


def sdp_cases() -> list[tuple[str, str]]:
    rng = random.Random(SEED)
    cases: list[tuple[str, str]] = []
    for name, sdp in sdp_fixtures().items():
        full = name in FULL_SWEEPS
        cases.append((f"{name}: as captured", sdp))
        cases += [(f"{name}: {c}", m) for c, m in sdp_sweeps(sdp, truncate=full, delete=True, duplicate=full)]
        cases += [(f"{name}: {c}", m) for c, m in sdp_mutations(sdp, rng, 20)]
    return cases


async def test_sdp_fuzz(fuzz_server: LiveServer, caplog: pytest.LogCaptureFixture) -> None:
    cases = sdp_cases()
    assert 400 <= len(cases) <= 800
    fds_before = own_fds(fuzz_server.port)
    limit = asyncio.Semaphore(8)
    started = time.monotonic()
    async with aiohttp.ClientSession() as http:

        async def offer(label: str, sdp: str) -> tuple[str, int, Any]:
            async with limit, http.post(f"{fuzz_server.url}/api/rtc/asr", json={"type": "offer", "sdp": sdp}) as r:
                return label, r.status, await r.json()

        outcomes = await asyncio.gather(*(offer(label, sdp) for label, sdp in cases))
    took = time.monotonic() - started
    counts = Counter(status for _, status, _ in outcomes)
    print(f"{len(cases)} offers in {took:.1f} s: {dict(counts)}")
    for label, status, body in outcomes:
        assert status in (200, 400), (label, status, body)
        if status == 400:
            assert body["code"] == "invalid_parameter" and "SDP" in body["error"], (label, body)
            assert "NoneType" not in body["error"], (label, body)  # a reason, not a parser's internals
        else:
            assert body["type"] == "answer" and body["sdp"].startswith("v=0"), (label, body)
        if label.endswith("as captured"):
            assert status == 200, (label, body)
            if "sendrecv" in label:  # the voice loop's outbound track, and Opus DTX, in the answer
                assert "a=sendrecv" in body["sdp"] and "usedtx=1" in body["sdp"], label
    assert counts[400] >= 50 and counts[200] >= 50
    # A well-formed session right after works end to end.
    peer = await connect(fuzz_server)
    try:
        peer.send("ping", message="after the fuzz")
        assert (await peer.next("pong", timeout=10))["message"] == "after the fuzz"
    finally:
        await peer.close()
    # Every answered offer gives its slot back, and no refused one left a socket open.
    await eventually(lambda: len(fuzz_server.app[SESSIONS]) == 0, CONNECT_TIMEOUT_S + 15)
    # The peers' sockets close as their sessions end: the same bound (CI's full run once needed more
    # than 10 s for 418 peers on a loaded machine; a socket left open never comes back in either).
    await fds_back_to(fds_before, fuzz_server.port, CONNECT_TIMEOUT_S + 15)
    assert server_errors(caplog) == []


def call_sdp_cases() -> list[tuple[str, str]]:
    """For /v1/realtime/calls: every fixture as captured, without each line in turn, and mutated."""
    rng = random.Random(SEED + 2)
    cases: list[tuple[str, str]] = []
    for name, sdp in sdp_fixtures().items():
        cases.append((f"{name}: as captured", sdp))
        cases += [(f"{name}: {c}", m) for c, m in sdp_sweeps(sdp, truncate=False, delete=True, duplicate=False)]
        cases += [(f"{name}: {c}", m) for c, m in sdp_mutations(sdp, rng, 10)]
    return cases


async def test_realtime_calls_sdp_fuzz(fuzz_server: LiveServer, caplog: pytest.LogCaptureFixture) -> None:
    """The same offers as raw SDP bodies to OpenAI Realtime calls: 201 with an answer or a 400."""
    cases = call_sdp_cases()
    assert 200 <= len(cases) <= 400
    fds_before = own_fds(fuzz_server.port)
    limit = asyncio.Semaphore(8)
    started = time.monotonic()
    async with aiohttp.ClientSession() as http:

        async def offer(label: str, sdp: str) -> tuple[str, int, Any]:
            headers = {"Content-Type": "application/sdp"}
            async with limit, http.post(f"{fuzz_server.url}/v1/realtime/calls", data=sdp, headers=headers) as r:
                return label, r.status, await (r.json() if r.status >= 400 else r.text())

        outcomes = await asyncio.gather(*(offer(label, sdp) for label, sdp in cases))
    counts = Counter(status for _, status, _ in outcomes)
    print(f"{len(cases)} call offers in {time.monotonic() - started:.1f} s: {dict(counts)}")
    for label, status, body in outcomes:
        assert status in (201, 400), (label, status, body)
        if status == 400:
            error = body["error"]
            assert error["code"] == "invalid_parameter" and "SDP" in error["message"], (label, body)
            assert "NoneType" not in error["message"], (label, body)
        else:
            assert body.startswith("v=0"), (label, body)
        if label.endswith("as captured") and "datachannel" in label:
            assert status == 201, (label, body)
    assert counts[400] >= 50 and counts[201] >= 20
    peer, _ = await connect_call(fuzz_server, raw_sdp=True)  # a real call right after works
    try:
        assert (await peer.next("session.created", timeout=10))["type"] == "session.created"
    finally:
        await peer.close()
    await eventually(lambda: len(fuzz_server.app[SESSIONS]) == 0, CONNECT_TIMEOUT_S + 15)
    # The peers' sockets close as their sessions end: the same bound (CI's full run once needed more
    # than 10 s for 418 peers on a loaded machine; a socket left open never comes back in either).
    await fds_back_to(fds_before, fuzz_server.port, CONNECT_TIMEOUT_S + 15)
    assert server_errors(caplog) == []


async def test_data_channel_control_fuzz(fuzz_server: LiveServer, caplog: pytest.LogCaptureFixture) -> None:
    rng = random.Random(SEED + 1)
    types = ["start", "stop", "ping", "interrupt", "reset", "hello", "infer"]
    messages: list[str | bytes] = [*control_messages(rng, types, 200, obj_key="obj")]
    messages += [bytes(rng.randrange(256) for _ in range(rng.randint(0, 64))) for _ in range(10)]
    rng.shuffle(messages)
    peer = await connect(fuzz_server)
    try:
        session_ids = set(fuzz_server.app[SESSIONS].ids())
        for message in messages:
            peer.channel.send(message)
        received: list[dict[str, Any]] = []
        # The channel is ordered: every message was handled once the ping's pong is back. What they
        # started in the background (transcripts) is sent before the ASR is idle again; a second
        # ping's pong then comes after all of it.
        for marker in ("still here", "and done"):
            if marker == "and done":
                await eventually(lambda: fuzz_server.app[ASR].open_jobs() == 0, 60)
            peer.send("ping", message=marker)
            while not (received and received[-1]["type"] == "pong" and received[-1]["message"] == marker):
                received.append(await peer.next(timeout=30))
        assert session_ids <= set(fuzz_server.app[SESSIONS].ids())  # the session survived all of it
    finally:
        await peer.close()
    kinds = Counter(m["type"] for m in received)
    print(f"{len(messages)} data channel messages: answers {dict(kinds)}")
    assert set(kinds) <= DC_MESSAGE_TYPES, kinds
    assert kinds["error"] >= 50
    for m in received:
        assert set(m) == {"type", "message", "obj"}, m
        if m["type"] == "error":
            assert isinstance(m["message"], str) and m["message"], m
            assert "internal" not in m["message"].lower(), m
    assert server_errors(caplog) == []
