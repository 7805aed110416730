"""Is a WebRTC peer still there? When it last sent anything, and a way to make a live one answer.

aiortc notices a vanished peer (a killed browser tab, a laptop lid closed, a network gone) only
through ICE consent freshness (RFC 7675): aioice checks every ~5 s and gives up after six failures,
so a dead peer holds its session for 30–34 s. Here every datagram a peer connection's ICE sockets
receive (STUN, DTLS, SRTP, SRTCP, SCTP: all of it) stamps the time on its ICE connection, and the
session's watchdog (``until_silent``: ``RtcSession`` on /api/rtc/asr, ``RealtimeCall`` on
/v1/realtime/calls) closes a connected peer that has sent nothing for ``rtc_dead_peer_timeout_s``.
A live peer is never quiet that long: browsers send their own ICE checks every ~2.5 s and answer
ours; a paused or DTX track still has those. To be sure, once a peer
has been silent for half the timeout the watchdog sends it one ICE consent check (a STUN binding
request with two retransmissions), which a live peer answers within a round trip; so an idle
connection costs nothing extra, and a dead one is reaped within the timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from aioice import ice, stun
from aiortc import RTCPeerConnection

log = logging.getLogger(__name__)

STAMP = "_mediaserver_last_rx"  # set by the receive_stamp patch (rtc_peer/patches.py)
PROBE_RETRANSMISSIONS = 2  # sent at 0, 0.5 and 1.5 s (aioice's RTO doubles from 0.5 s)


def ice_connections(pc: RTCPeerConnection) -> list[ice.Connection]:
    """The aioice connections under a peer connection's transports (one with BUNDLE)."""
    dtls_transports = [t.receiver.transport for t in pc.getTransceivers()]
    if pc.sctp is not None:
        dtls_transports.append(pc.sctp.transport)
    found: dict[int, ice.Connection] = {}
    for dtls in dtls_transports:
        connection = getattr(getattr(dtls, "transport", None), "_connection", None)
        if isinstance(connection, ice.Connection):
            found[id(connection)] = connection
    return list(found.values())


def silent_for(pc: RTCPeerConnection) -> float | None:
    """Seconds since the peer last sent anything; None before it sent anything at all."""
    stamps = [getattr(c, STAMP, None) for c in ice_connections(pc)]
    received = [s for s in stamps if s is not None]
    return time.monotonic() - max(received) if received else None


async def probe(pc: RTCPeerConnection) -> bool:
    """Send an ICE consent check on every nominated pair; True if the peer answered one.

    The answer also stamps the connection (it arrives as a datagram), which is what the watchdog reads.
    """
    answered = False
    for connection in ice_connections(pc):
        password = connection.remote_password
        if password is None:
            continue
        for pair in list(connection._nominated.values()):
            request = connection.build_request(pair, nominate=False)
            with contextlib.suppress(stun.TransactionError, ConnectionError, OSError, AssertionError):
                await pair.protocol.request(
                    request,
                    pair.remote_addr,
                    integrity_key=password.encode("utf8"),
                    retransmissions=PROBE_RETRANSMISSIONS,
                )
                answered = True
    return answered


async def until_silent(pc: RTCPeerConnection, timeout_s: float, probe_name: str) -> float | None:
    """Wait until the connected peer has sent nothing for ``timeout_s``: the seconds it was silent.
    None when the connection ends first (closed or failed: its owner is closing it already).

    The watch wakes only when something is due (half the timeout after the peer's latest datagram,
    then the timeout), not on a fixed poll. Once the peer has been silent for half the timeout, one
    consent check (``probe``) makes a live peer answer; the probe runs as a task named
    ``probe_name`` (so it carries the session id) and ends with this watch.
    """
    probing: asyncio.Task[bool] | None = None
    poll_s = min(0.5, timeout_s / 4)
    delay_s = poll_s
    try:
        while pc.connectionState not in ("closed", "failed"):
            await asyncio.sleep(delay_s)
            delay_s = poll_s
            if pc.connectionState != "connected":
                continue  # still connecting: the connect timeout's business
            silent_s = silent_for(pc)
            if silent_s is None:
                continue
            if silent_s > timeout_s:
                return silent_s
            if silent_s > timeout_s / 2 and (probing is None or probing.done()):
                probing = asyncio.get_running_loop().create_task(probe(pc), name=probe_name)
                probing.add_done_callback(_log_failure)
            # Nothing is due before the next mark (the probe at half the timeout, then the timeout):
            # sleep until it rather than wake every poll_s, which an idle session would pay for.
            mark_s = timeout_s / 2 if silent_s <= timeout_s / 2 else timeout_s
            delay_s = max(0.05, mark_s - silent_s + 0.01)
        return None
    finally:
        if probing is not None and not probing.done():
            probing.cancel()


def _log_failure(task: asyncio.Task[bool]) -> None:
    """``probe`` expects the failures of a vanished peer; anything else is a bug, logged, never left
    for asyncio to report as "never retrieved"."""
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.error("%s failed", task.get_name(), exc_info=exc)
