"""What every WebRTC face shares about a peer connection: ICE servers, answering an offer, reading
the incoming audio track, the watchdogs, and closing a connection that a malformed offer left half
built. ``ServerPeer`` holds a face's connection and the tasks it runs for it.

The faces (``webrtc/`` on /api/rtc/asr, ``openai/realtime/calls.py`` on /v1/realtime/calls)
own their sessions and protocols; this module knows nothing of either.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import av
import numpy as np
from aiortc import RTCConfiguration, RTCIceServer, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from mediaserver.config import Settings
from mediaserver.errors import ApiError, InvalidParameter
from mediaserver.events import AudioArray
from mediaserver.transport.rtc_peer import liveness as rtc_liveness
from mediaserver.transport.rtc_peer import patches
from mediaserver.transport.rtc_peer.sdp import check_offer, sdp_problem, with_opus_dtx

log = logging.getLogger(__name__)

TIMESTAMP_GAP_S = 0.03  # a frame's timestamp this far past the end of the one before: a gap in the audio
TRACK_PAUSE_S = 0.5  # no frame for this long: a gap, whatever the timestamps say (rtc_track_pause_ms)
GAP_CREDIT_FRAMES = 25  # a timestamp jump this many frames after such a wait is the same gap


def ice_servers(settings: Settings) -> list[RTCIceServer]:
    servers = []
    for url in settings.rtc_ice_servers:
        if url.startswith(("turn:", "turns:")):
            servers.append(
                RTCIceServer(urls=url, username=settings.rtc_turn_username, credential=settings.rtc_turn_password)
            )
        else:
            servers.append(RTCIceServer(urls=url))
    return servers


async def read_audio_track(
    track: MediaStreamTrack,
    resampler: av.AudioResampler,
    feed: Callable[[AudioArray], Awaitable[None]],
    on_frame: Callable[[], None],
    on_gap: Callable[[float], Awaitable[None]] | None = None,
    *,
    pause_s: float = TRACK_PAUSE_S,
    on_skipped: Callable[[float], Awaitable[None]] | None = None,
) -> None:
    """Read an incoming audio track until it ends: each frame resampled (16 kHz mono float) and fed.

    ``on_gap(seconds)``: the sender sent nothing for that long before this frame (Opus DTX, a
    paused track). Its timestamps say so when they jump past the end of the frame before; a sender
    whose timestamps go on where they stopped (aiortc's) shows it only as no frame for
    ``pause_s`` or more. Both can see one gap: aiortc's jitter buffer holds the last frames
    before a pause until packets come again, so the first of them comes late, and the jump follows a
    few frames on; a jump counts only what such a wait did not (``GAP_CREDIT_FRAMES``). What the
    reader itself spent feeding is not a gap: frames waiting meanwhile come at once.

    ``on_skipped(seconds)``: the frame's timestamp jumped that far past the end of the one before:
    time the sender itself says it skipped (Opus DTX in silence), the whole of it. Only the
    timestamps are taken for it, never a wait: a wait may be this server's event loop held up (a
    loaded machine), the frames queued meanwhile then come at once with their timestamps in order
    (a review: a stall taken for a gap split an utterance in two)."""
    expected_s: float | None = None  # the timestamp at which the next frame would follow the last
    credit_s, credit_frames = 0.0, 0  # a wait already counted as a gap, that a jump may confirm
    with contextlib.suppress(MediaStreamError):
        while True:
            asked_at = time.monotonic()
            frame = await track.recv()
            waited_s = time.monotonic() - asked_at
            on_frame()
            if not isinstance(frame, av.AudioFrame):
                continue
            if on_gap is not None or on_skipped is not None:
                at_s = float(frame.pts * frame.time_base) if frame.pts is not None and frame.time_base else None
                jump_s = at_s - expected_s if at_s is not None and expected_s is not None else 0.0
                if on_skipped is not None and jump_s > TIMESTAMP_GAP_S:
                    await on_skipped(jump_s)
                gap_s = 0.0
                if jump_s > TIMESTAMP_GAP_S:
                    gap_s, credit_s = max(0.0, jump_s - credit_s), 0.0
                elif waited_s >= pause_s and expected_s is not None:
                    gap_s, credit_s, credit_frames = waited_s, credit_s + waited_s, 0
                credit_frames += 1
                if credit_frames > GAP_CREDIT_FRAMES:
                    credit_s = 0.0
                if gap_s > 0 and on_gap is not None:
                    await on_gap(gap_s)
                if at_s is not None:
                    expected_s = at_s + frame.samples / frame.sample_rate
            frame.pts = None
            for out in resampler.resample(frame):
                await feed(np.asarray(out.to_ndarray(), dtype=np.float32).reshape(-1))


def can_send_audio(pc: RTCPeerConnection) -> bool:
    """The remote offer can receive audio (``sendrecv`` or ``recvonly`` on its side). aiortc keeps
    each transceiver's offered direction reversed, from this side: ``sendrecv`` or ``sendonly``."""
    return any(
        t.kind == "audio" and getattr(t, "_offerDirection", None) in ("sendrecv", "sendonly")
        for t in pc.getTransceivers()
    )


def log_task_failure(task: asyncio.Task[Any], session_id: str) -> None:
    """A session task's done callback: a failure is logged here (a bug), never left for asyncio to
    report as "Task exception was never retrieved"."""
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.error("session %s: task %s failed", session_id, task.get_name(), exc_info=exc)


async def answer_offer(
    pc: RTCPeerConnection,
    sdp: str,
    *,
    session_id: str,
    prepare: Callable[[], None],
    opus_dtx: bool,
    idle_rtcp_interval_s: float,
    audio_jitter_frames: int | None = None,
) -> str:
    """Take a client's SDP offer and answer it (no trickle ICE: the answer carries the candidates).

    ``prepare`` runs between the two: it checks what the endpoint needs of the offer (raising an
    ApiError) and adds outbound tracks. Whatever a mangled offer makes aiortc raise (its parser's
    asserts, negotiation ValueErrors, errors on a half-built connection) is a 400 naming the problem,
    logged in one INFO line. On any error the caller closes ``pc`` (``close_peer_connection``).
    The connection's RTCP reports slow down while its streams are idle (``rtc_peer/rtcp.py``), and its
    audio receivers hold ``audio_jitter_frames`` frames (``rtc_audio_jitter_frames``; None = aiortc's 4).
    """
    try:
        check_offer(sdp)
        await pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="offer"))
        if audio_jitter_frames is not None:
            patches.set_audio_jitter(pc, audio_jitter_frames)
        prepare()
        await pc.setLocalDescription(await pc.createAnswer())
        patches.quiet_idle_reports(pc, idle_rtcp_interval_s)
    except (ApiError, asyncio.CancelledError):
        raise
    except Exception as exc:  # aiortc's parser and negotiation: anything a mangled offer makes them raise
        log.info("session %s: refused the offer: %r", session_id, exc)
        raise InvalidParameter(sdp_problem(exc), param="sdp") from None
    answer = pc.localDescription.sdp
    return with_opus_dtx(answer) if opus_dtx else answer


async def close_peer_connection(pc: RTCPeerConnection, session_id: str) -> None:
    """``pc.close()``, and when it fails (aiortc stops at the first transceiver without a transport,
    which a malformed offer leaves behind), stop every transport it created one by one."""
    try:
        await pc.close()
        return
    except Exception as exc:
        log.debug("session %s: closing the peer connection: %r; stopping its transports", session_id, exc)
    dtls_transports = list(getattr(pc, "_RTCPeerConnection__dtlsTransports", ()))
    ice_transports = list(getattr(pc, "_RTCPeerConnection__iceTransports", ()))
    steps: list[Any] = [t.stop for t in pc.getTransceivers()]
    if pc.sctp is not None:
        steps.append(pc.sctp.stop)
    steps += [t.stop for t in dtls_transports] + [t.stop for t in ice_transports]
    for step in steps:
        with contextlib.suppress(Exception):
            await step()
    pc.remove_all_listeners()


async def watch_connect(
    pc: RTCPeerConnection,
    timeout_s: float,
    *,
    name: str,
    closed: Callable[[], bool],
    close: Callable[[], Awaitable[None]],
) -> None:
    """Close a peer connection that is not connected ``timeout_s`` (``rtc_connect_timeout_s``) after
    its answer: an offer whose peer never connects must not hold a session."""
    await asyncio.sleep(timeout_s)
    if pc.connectionState != "connected" and not closed():
        log.info("%s: not connected after %g s, closing", name, timeout_s)
        await close()


async def watch_liveness(
    pc: RTCPeerConnection,
    timeout_s: float,
    *,
    name: str,
    probe_name: str,
    closed: Callable[[], bool],
    close: Callable[[], object],
) -> None:
    """Close a connected peer that has sent nothing for ``timeout_s`` (``rtc_dead_peer_timeout_s``;
    0 turns it off; see rtc_peer/liveness.py). ``close`` starts the closing and returns at once."""
    if timeout_s <= 0:
        return
    silent_s = await rtc_liveness.until_silent(pc, timeout_s, probe_name)
    if silent_s is not None and not closed():
        log.info("%s: the peer sent nothing for %.1f s, closing", name, silent_s)
        close()


def start_watchdogs(
    pc: RTCPeerConnection,
    settings: Settings,
    *,
    kind: str,
    session_id: str,
    closed: Callable[[], bool],
    close: Callable[[], Coroutine[Any, Any, None]],
    spawn: Callable[[Coroutine[Any, Any, None], str], object],
) -> None:
    """Start both watchdogs of a session's peer connection with its own ``spawn`` (so they end with
    it): tasks ``{kind}-connect-watch`` and ``{kind}-liveness``, the probe ``{kind}-probe-{id}``, and
    a silent peer's close as ``{kind}-close``. Logs name the session as ``{kind} {id}``."""
    name = f"{'session' if kind == 'rtc' else kind} {session_id}"
    spawn(
        watch_connect(pc, settings.rtc_connect_timeout_s, name=name, closed=closed, close=close),
        f"{kind}-connect-watch",
    )
    spawn(
        watch_liveness(
            pc,
            settings.rtc_dead_peer_timeout_s,
            name=name,
            probe_name=f"{kind}-probe-{session_id}",
            closed=closed,
            close=lambda: spawn(close(), f"{kind}-close"),
        ),
        f"{kind}-liveness",
    )


class ServerPeer:
    """A face's side of one peer connection: the ``RTCPeerConnection`` and the tasks the face runs for
    it (track readers, message handlers, the watchdogs, its own closing), each named after the
    session, a failure of one logged (``log_task_failure``). Both WebRTC faces own one; ``aclose``
    ends its tasks and the connection."""

    def __init__(self, settings: Settings, session_id: str, kind: str) -> None:
        self.settings = settings
        self.id = session_id
        self.kind = kind  # in task and log names: "rtc" (/api/rtc/asr), "call" (/v1/realtime/calls)
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=ice_servers(settings)))
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        """Run ``coro`` as the task ``{name}-{id}``, ended by ``aclose``."""
        task = asyncio.get_running_loop().create_task(coro, name=f"{name}-{self.id}")
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        log_task_failure(task, self.id)

    def start_watchdogs(self, closed: Callable[[], bool], close: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Close the session (``close``) if its peer never connects, or goes silent (``start_watchdogs``)."""
        start_watchdogs(
            self.pc, self.settings, kind=self.kind, session_id=self.id, closed=closed, close=close, spawn=self.spawn
        )

    def cancel_tasks(self) -> None:
        """Cancel every task but the caller's (closing may run in one of them)."""
        current = asyncio.current_task()
        for task in list(self._tasks):
            if task is not current:
                task.cancel()

    async def aclose(self) -> None:
        """Cancel the tasks (but the caller's), close the connection (never raises, even half built),
        then wait for the tasks to end."""
        self.cancel_tasks()
        await close_peer_connection(self.pc, self.id)
        current = asyncio.current_task()
        for task in list(self._tasks):
            if task is not current:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
