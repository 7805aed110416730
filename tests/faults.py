"""Helpers for the hardening tests: raw sockets for requests no well-behaved client sends, the server's
own log records and metrics, and the process's file descriptors and tasks (to find leaks)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import time
from collections.abc import Callable

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from mediaserver.tts.service import TtsService
from mediaserver.tts.types import VoiceInfo

# Libraries whose ERROR lines are the server's (the tests' own clients log elsewhere or not at all).
SERVER_LOGGERS = ("mediaserver", "aiohttp", "aiortc", "aioice", "asyncio", "wyoming")


def server_errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    """ERROR (and worse) records of the server so far. Collects garbage first: asyncio reports a task
    whose exception nobody retrieved only when the task is freed."""
    gc.collect()
    return [
        f"{r.name}: {r.getMessage()}"
        for r in caplog.records
        if r.levelno >= logging.ERROR and r.name.split(".")[0] in SERVER_LOGGERS
    ]


async def raw_exchange(host: str, port: int, data: bytes, *, timeout_s: float = 10.0, half_close: bool = True) -> bytes:
    """Send raw bytes, then read whatever comes back until the server closes (or ``timeout_s``)."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(data)
        await writer.drain()
        if half_close and writer.can_write_eof():
            writer.write_eof()
        received = bytearray()
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            try:
                block = await asyncio.wait_for(reader.read(65536), timeout=left)
            except (TimeoutError, ConnectionError):
                break
            if not block:
                break
            received += block
        return bytes(received)
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await writer.wait_closed()


def statuses(response: bytes) -> list[int]:
    """The status codes of every HTTP/1.1 response in a raw byte stream."""
    found = []
    for line in response.split(b"\r\n"):
        if line.startswith(b"HTTP/1.1 "):
            found.append(int(line.split()[1]))
    return found


async def metrics_text(url: str) -> str:
    """The server's ``/metrics`` page."""
    async with aiohttp.ClientSession() as session, session.get(f"{url}/metrics") as resp:
        return await resp.text()


async def metric_samples(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = await metrics_text(url)
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def requests_with_status(url: str, status: int) -> float:
    samples = await metric_samples(url)
    return sum(
        value
        for (name, labels), value in samples.items()
        if name == "mediaserver_requests_total" and dict(labels).get("status") == str(status)
    )


async def in_flight(url: str, route: str) -> float:
    """HTTP requests to ``route`` the server is handling now (``mediaserver_requests_in_flight``)."""
    samples = await metric_samples(url)
    return sum(
        value
        for (name, labels), value in samples.items()
        if name == "mediaserver_requests_in_flight" and dict(labels).get("route") == route
    )


def _tcp_ports() -> dict[str, tuple[int, int]]:
    """Socket inode → (local port, remote port) for every TCP socket in this network namespace."""
    ports: dict[str, tuple[int, int]] = {}
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as lines:
            for line in list(lines)[1:]:
                fields = line.split()
                local, remote = (int(a.rsplit(":", 1)[1], 16) for a in fields[1:3])
                ports[fields[9]] = (local, remote)
    return ports


def own_fds(port: int) -> dict[int, str]:
    """This process's file descriptors and what each points at, without the TCP connections that do
    not touch ``port``: every file, pipe and UDP socket (WebRTC's), and the server's TCP connections.
    Other parts of a test process keep pooled connections that come and go on their own timers (a
    shared engine's health probe), so a count of every descriptor moves without any leak."""
    tcp = _tcp_ports()
    fds: dict[int, str] = {}
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{name}")
            inode = target[len("socket:[") : -1] if target.startswith("socket:[") else None
            if inode is not None and inode in tcp and port not in tcp[inode]:
                continue
            fds[int(name)] = target
    return fds


async def fds_back_to(before: dict[int, str], port: int, timeout_s: float) -> None:
    """Wait until this process holds no more of ``own_fds(port)`` than ``before``; at ``timeout_s``
    fail naming the descriptors opened since (a socket: whether TCP to ``port`` or UDP)."""
    started = time.monotonic()
    while len(now := own_fds(port)) > len(before) and time.monotonic() - started <= timeout_s:
        await asyncio.sleep(0.05)
    tcp = _tcp_ports()
    opened = sorted(
        f"{fd}: {target}" + (f" tcp {tcp[target[8:-1]]}" if target[8:-1] in tcp else "")
        for fd, target in now.items()
        if before.get(fd) != target
    )
    assert len(now) <= len(before), f"{len(now)} descriptors where {len(before)} were open; new: {opened}"


def session_tasks(session_id: str) -> list[str]:
    """The names of the running tasks named for a session (the server names them after its id)."""
    return [t.get_name() for t in asyncio.all_tasks() if session_id in t.get_name()]


async def tasks_ended(*session_ids: str, timeout_s: float = 5.0) -> None:
    """Wait until no running task is named for any of ``session_ids``; at ``timeout_s``, fail naming
    the ones left. A closing session's tasks end soon, however loaded the machine; a leaked one never."""
    with contextlib.suppress(AssertionError):
        await eventually(lambda: not any(session_tasks(s) for s in session_ids), timeout_s)
    left = [name for s in session_ids for name in session_tasks(s)]
    assert left == [], left


def abort_ws(ws: aiohttp.ClientWebSocketResponse) -> None:
    """Drop a client WebSocket's TCP connection: no close frame, the client just goes away."""
    ws._response.connection.transport.abort()  # type: ignore[union-attr]


async def eventually(check: Callable[[], bool], timeout_s: float, interval_s: float = 0.05) -> float:
    """Poll ``check`` until it holds; the seconds it took. Fails the test at ``timeout_s``."""
    started = time.monotonic()
    while not check():
        if time.monotonic() - started > timeout_s:
            raise AssertionError(f"not true within {timeout_s:g} s")
        await asyncio.sleep(interval_s)
    return time.monotonic() - started


async def one_sentence_later(tts: TtsService, voice: VoiceInfo) -> None:
    """Synthesize one short sentence to its end on ``tts`` (a TtsService): a wait as long as a
    sentence takes on this machine, however loaded, where a fixed sleep would be too short on a
    slow machine to let wrongly started work show. It adds one to ``sentences_done``."""
    async with tts.speak("One more.", voice) as speech:
        async for _ in speech:
            pass
