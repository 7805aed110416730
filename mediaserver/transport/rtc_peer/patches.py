"""Every change mediaserver makes to aiortc's (and aioice's) private internals, in one place.

aiortc has no public hook for any of these, so each one wraps a private method. Private methods can
change in any release: each patch first checks that its target is there and looks as expected (and
that aiortc's major version is 1; pyproject.toml caps the version), installs itself only then, and
otherwise leaves aiortc alone and logs a warning naming what it could not do. ``install()`` runs at
start-up (the WebRTC faces' ``add_routes``); it is idempotent, and ``INSTALLED`` says which patches
are in (tests/unit/test_rtc_rtcp.py fails when an upgrade moves a target).

- ``bye_filter``: receivers ignore RTCP BYE, which Chrome sends on ``replaceTrack(null)`` (a pause),
  so audio flows into the same session when the browser resumes, as in WIS.
- ``connect_guard``: aiortc's connect task, which nobody awaits, stays quiet when its connection
  closed while it was connecting (see ``_connect_guard``).
- ``idle_rtcp_sender``, ``idle_rtcp_receiver``: the RTCP report loops of peer connections that opted
  in wait longer between reports that say nothing new (rtc_peer/rtcp.py).
- ``receive_stamp``: every datagram an ICE connection receives stamps the time on it, which the
  dead-peer watchdog reads (rtc_peer/liveness.py).
- ``set_audio_jitter`` (per connection, not a class patch): an audio receiver's jitter buffer is
  replaced by one that holds ``rtc_audio_jitter_frames`` frames. aiortc's own holds 4 (80 ms at
  20 ms a packet) before it passes the oldest on: latency added to every end of speech, and the
  last 80 ms of an utterance stay in it while a paused track sends nothing.
- ``quiet_idle_reports`` (per connection): opts a connection in to the idle RTCP cadence, after
  installing the patches it needs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiortc
from aioice import ice
from aiortc import RTCPeerConnection
from aiortc.exceptions import InvalidStateError
from aiortc.jitterbuffer import JitterBuffer
from aiortc.rtcrtpreceiver import RTCRtpReceiver
from aiortc.rtcrtpsender import RTCRtpSender
from aiortc.rtp import RtcpByePacket

from mediaserver.transport.rtc_peer import liveness, rtcp

log = logging.getLogger(__name__)

_MARK = "_mediaserver_patch"  # set on every wrapper: its patch's name

INSTALLED: dict[str, bool] = {}


def _is_patched(target: Any) -> bool:
    return getattr(target, _MARK, None) is not None


def _mark(wrapper: Any, name: str) -> None:
    setattr(wrapper, _MARK, name)


def _bye_filter() -> None:
    original = RTCRtpReceiver._handle_rtcp_packet

    async def handle_rtcp_packet(self: RTCRtpReceiver, packet: Any) -> None:
        if isinstance(packet, RtcpByePacket):
            log.debug("ignoring RTCP BYE (track paused, not ended)")
            return
        await original(self, packet)

    _mark(handle_rtcp_packet, "bye_filter")
    RTCRtpReceiver._handle_rtcp_packet = handle_rtcp_packet  # type: ignore[method-assign]


def _connect_guard() -> None:
    """``setLocalDescription`` starts ``RTCPeerConnection.__connect`` as a task nobody awaits. A peer
    connection closed while that task is still starting its transports (an offer whose peer never
    connects, closed after ``rtc_connect_timeout_s``; a refused offer) can make it start one that
    is already closed: ``InvalidStateError``, which asyncio then logs at ERROR as "Task exception
    was never retrieved". Once the connection is closing that is expected, and logged at DEBUG; any
    other failure of the task propagates as before."""
    original = RTCPeerConnection._RTCPeerConnection__connect  # type: ignore[attr-defined]

    async def connect(self: RTCPeerConnection) -> None:
        try:
            await original(self)
        except (InvalidStateError, ConnectionError) as exc:
            if getattr(self, "_RTCPeerConnection__isClosed", None) is None:
                raise
            log.debug("a peer connection closed while it was connecting: %r", exc)

    _mark(connect, "connect_guard")
    RTCPeerConnection._RTCPeerConnection__connect = connect  # type: ignore[attr-defined]


def _idle_rtcp(cls: type, as_list: bool, name: str) -> Callable[[], None]:
    def install() -> None:
        original: Callable[[Any, Any], Awaitable[None]] = cls._send_rtcp  # type: ignore[attr-defined]

        async def _send_rtcp(self: Any, packets: Any) -> None:
            await original(self, packets)
            await rtcp.after_report(self, packets if as_list else [packets])

        _mark(_send_rtcp, name)
        cls._send_rtcp = _send_rtcp  # type: ignore[attr-defined]

    return install


def _receive_stamp() -> None:
    original = ice.StunProtocol.datagram_received

    def datagram_received(self: ice.StunProtocol, data: bytes | str, addr: tuple[Any, ...]) -> None:
        setattr(self.receiver, liveness.STAMP, time.monotonic())
        original(self, data, addr)

    _mark(datagram_received, "receive_stamp")
    ice.StunProtocol.datagram_received = datagram_received  # type: ignore[method-assign]


_JITTER_BUFFER = "_RTCRtpReceiver__jitter_buffer"  # RTCRtpReceiver.__init__ makes it; _handle_rtp_packet uses it


def set_audio_jitter(pc: RTCPeerConnection, prefetch_frames: int) -> bool:
    """Give ``pc``'s audio receivers a jitter buffer that holds ``prefetch_frames`` frames before
    passing one on (aiortc's capacity kept: packets still wait for a late one within it). Call it
    before media flows (after the remote description). False, with a warning, if aiortc changed."""
    for transceiver in pc.getTransceivers():
        if transceiver.kind != "audio":
            continue
        buffer = getattr(transceiver.receiver, _JITTER_BUFFER, None)
        if not isinstance(buffer, JitterBuffer):
            log.warning("aiortc %s: audio receivers have no jitter buffer where expected", aiortc.__version__)
            return False
        setattr(transceiver.receiver, _JITTER_BUFFER, JitterBuffer(capacity=buffer.capacity, prefetch=prefetch_frames))
    return True


# name → (the private attributes it wraps, how to install it)
_PATCHES: dict[str, tuple[tuple[tuple[type, str], ...], Callable[[], None]]] = {
    "bye_filter": (((RTCRtpReceiver, "_handle_rtcp_packet"),), _bye_filter),
    "connect_guard": (((RTCPeerConnection, "_RTCPeerConnection__connect"),), _connect_guard),
    "idle_rtcp_sender": (
        ((RTCRtpSender, "_send_rtcp"), (RTCRtpSender, rtcp.LOOP)),
        _idle_rtcp(RTCRtpSender, as_list=True, name="idle_rtcp_sender"),  # _send_rtcp(packets: list)
    ),
    "idle_rtcp_receiver": (
        ((RTCRtpReceiver, "_send_rtcp"), (RTCRtpReceiver, rtcp.LOOP)),
        _idle_rtcp(RTCRtpReceiver, as_list=False, name="idle_rtcp_receiver"),  # _send_rtcp(packet)
    ),
    "receive_stamp": (((ice.StunProtocol, "datagram_received"),), _receive_stamp),
}


def install() -> dict[str, bool]:
    """Install every patch whose target looks as expected; returns (and keeps in ``INSTALLED``) which are in."""
    major = aiortc.__version__.split(".")[0]
    for name, (targets, patch) in _PATCHES.items():
        if INSTALLED.get(name):
            continue
        found = [getattr(cls, attribute, None) for cls, attribute in targets]
        if major != "1" or not all(callable(target) for target in found):
            log.warning("aiortc %s: not installing %s (its internals are not as expected)", aiortc.__version__, name)
            INSTALLED[name] = False
            continue
        if not _is_patched(found[0]):
            patch()
        INSTALLED[name] = True
    return dict(INSTALLED)


def quiet_idle_reports(pc: RTCPeerConnection, interval_s: float) -> None:
    """Let ``pc``'s senders and receivers report every ``interval_s`` (± 50 %) while idle; 0 = aiortc's
    cadence (rtcp.py). Installs the patches first: the report loops must be wrapped for it to work."""
    install()
    rtcp.set_idle_interval(pc, interval_s)
