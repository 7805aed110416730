"""A WebRTC peer for tests: an aiortc client with a microphone stand-in that plays clips in real
time, the WIS data channel, and a recorder of the audio the server sends back (the assistant)."""

from __future__ import annotations

import asyncio
import contextlib
import fractions
import itertools
import json
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import av
import numpy as np
from aiortc import RTCDataChannel, RTCPeerConnection, RTCRtpSender, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from aiortc.rtp import RtcpByePacket

from mediaserver.transport.rtc_peer.liveness import ice_connections
from tests.conftest import Clip, resample_to

RATE = 48000
FRAME = 960  # 20 ms


class ClipTrack(MediaStreamTrack):
    """A microphone stand-in: plays queued clips in real time, silence otherwise.

    ``go_quiet`` makes it send nothing at all for a while once the queued audio has played, as a
    browser does with Opus DTX during silence or a paused track; timestamps keep following the
    clock across the gap.
    """

    kind = "audio"

    def __init__(self) -> None:
        super().__init__()
        self._queue = np.zeros(0, np.int16)
        self._pts = 0
        self._started: float | None = None
        self.playing_from: float | None = None  # when the latest clip's first frame went out
        self._quiet_s = 0.0  # after the queue empties: send no frames for this long
        self.quiet_from: float | None = None
        self.played = asyncio.Event()  # set once every queued frame has gone out (however late the loop)
        self.played.set()

    def go_quiet(self, seconds: float) -> None:
        self._quiet_s = seconds

    def play(self, clip: Clip, silence_after_s: float = 0.8) -> float:
        pcm = (np.clip(resample_to(clip, RATE), -1, 1) * 32767).astype(np.int16)
        pcm = np.concatenate([pcm, np.zeros(int(silence_after_s * RATE), np.int16)])
        self._queue = np.concatenate([self._queue, pcm])
        self.playing_from = None
        self.played.clear()
        return len(self._queue) / RATE

    async def recv(self) -> av.AudioFrame:
        if self._started is None:
            self._started = time.monotonic()
        wait = self._started + self._pts / RATE - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        elif wait < -0.1:  # the loop was busy: a microphone does not catch up in a burst
            self._started -= wait
        if not self._queue.size and self._quiet_s > 0:
            quiet_s, self._quiet_s = self._quiet_s, 0.0
            self.quiet_from = time.monotonic()
            await asyncio.sleep(quiet_s)  # no frame, so no RTP packet, for quiet_s
            self._pts += int(quiet_s * RATE) // FRAME * FRAME
        if self._queue.size and self.playing_from is None:
            self.playing_from = time.monotonic()
        chunk, self._queue = self._queue[:FRAME], self._queue[FRAME:]
        if not self._queue.size:
            self.played.set()
        if chunk.size < FRAME:
            chunk = np.concatenate([chunk, np.zeros(FRAME - chunk.size, np.int16)])
        frame = av.AudioFrame.from_ndarray(chunk.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = RATE
        frame.pts = self._pts
        frame.time_base = fractions.Fraction(1, RATE)
        self._pts += FRAME
        return frame


@dataclass
class Received:
    """A frame of the server's outbound audio: when it arrived (monotonic) and its 48 kHz samples."""

    at: float
    pcm: np.ndarray


@dataclass
class Peer:
    pc: RTCPeerConnection
    channel: RTCDataChannel
    sender: RTCRtpSender
    track: ClipTrack
    messages: asyncio.Queue[dict[str, Any]] = field(default_factory=asyncio.Queue)
    received: list[Received] = field(default_factory=list)
    packets_at: list[float] = field(default_factory=list)  # when each RTP packet of the server's arrived
    rtp: list[tuple[int, int, int]] = field(default_factory=list)  # each one's sequence, timestamp, payload size
    remote_tracks: int = 0
    _readers: list[asyncio.Task[None]] = field(default_factory=list)

    async def _read_remote(self, track: MediaStreamTrack) -> None:
        """Always read an incoming track (aiortc buffers an unread one without bound)."""
        with contextlib.suppress(MediaStreamError):
            while True:
                frame = await track.recv()
                assert isinstance(frame, av.AudioFrame)
                samples = frame.to_ndarray()
                mono = samples.reshape(-1, len(frame.layout.channels))[:, 0] if samples.ndim > 1 else samples
                self.received.append(Received(time.monotonic(), np.asarray(mono).reshape(-1).copy()))

    def received_audio(self, since: float = 0.0, until: float = float("inf")) -> np.ndarray:
        """The server's audio received in [since, until), as 48 kHz float32."""
        parts = [r.pcm for r in self.received if since <= r.at < until]
        if not parts:
            return np.zeros(0, np.float32)
        return np.concatenate(parts).astype(np.float32) / 32768.0

    def rtp_report(self) -> str:
        """What arrived of the server's RTP, for a failure's message: packets and frames, sequence
        gaps and reorderings, and packets sharing a timestamp (aiortc's jitter buffer joins those
        into one frame for the decoder)."""
        gaps = [(a[0], b[0]) for a, b in itertools.pairwise(self.rtp) if (b[0] - a[0]) % 65536 != 1]
        shared = [a[0] for a, b in itertools.pairwise(self.rtp) if a[1] == b[1]]
        sizes = [size for _, _, size in self.rtp]
        return (
            f"{len(self.rtp)} RTP packets, {len(self.received)} frames decoded; sequence jumps {gaps[:8]}; "
            f"timestamps shared after {shared[:8]}; payloads {min(sizes, default=0)}-{max(sizes, default=0)} bytes"
        )

    async def close(self) -> None:
        for reader in self._readers:
            reader.cancel()
        await self.pc.close()

    def send(self, kind: str, obj: Any = None, message: Any = None) -> None:
        self.channel.send(json.dumps({"type": kind, "message": message, "obj": obj}))

    async def next(self, kind: str | None = None, timeout: float = 30.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            msg = await asyncio.wait_for(self.messages.get(), timeout=max(0.01, deadline - time.monotonic()))
            if kind is None or msg["type"] == kind:
                return msg

    async def pause(self) -> None:
        """What Chrome does on replaceTrack(null): stop sending, and an RTCP BYE for the stream."""
        self.sender.replaceTrack(None)
        await self.sender._send_rtcp([RtcpByePacket(sources=[self.sender._ssrc])])

    def resume(self) -> None:
        self.sender.replaceTrack(self.track)

    def vanish(self) -> None:
        """The peer's sockets go quiet without a goodbye (no DTLS close, no SCTP abort): what a killed
        process or a lost network looks like from the server. ``close`` it once the server let go."""
        for connection in ice_connections(self.pc):
            for protocol in connection._protocols:
                protocol.transport.close()


async def connect(server: Any, query: str = "", *, direction: str = "sendrecv", track: ClipTrack | None = None) -> Peer:
    pc = RTCPeerConnection()
    channel = pc.createDataChannel("chat", ordered=True)
    track = track or ClipTrack()
    sender = pc.addTrack(track) if direction == "sendrecv" else pc.addTransceiver(track, direction=direction).sender
    peer = Peer(pc, channel, sender, track)
    opened = asyncio.Event()
    channel.on("open", opened.set)

    @pc.on("track")
    def on_track(remote: MediaStreamTrack) -> None:
        peer.remote_tracks += 1
        peer._readers.append(asyncio.get_running_loop().create_task(peer._read_remote(remote)))

    @channel.on("message")
    def on_message(data: str) -> None:
        peer.messages.put_nowait(json.loads(data))

    await pc.setLocalDescription(await pc.createOffer())
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{server.url}/api/rtc/asr{query}",
            json={"sdp": pc.localDescription.sdp, "type": pc.localDescription.type},
        ) as resp,
    ):
        assert resp.status == 200, await resp.text()
        answer = await resp.json()
    assert answer["type"] == "answer"
    await pc.setRemoteDescription(RTCSessionDescription(sdp=answer["sdp"], type="answer"))
    for receiver in pc.getReceivers():
        _time_packets(receiver, peer)
    await asyncio.wait_for(opened.wait(), timeout=15)
    return peer


def _time_packets(receiver: Any, peer: Peer) -> None:
    """Note when each RTP packet reaches ``receiver``, before aiortc's jitter buffer: that holds the
    first frames of a track until ``CLIENT_JITTER_HOLD`` have come (60-80 ms more for the first
    answer of a connection), and later answers push the last one's held frames out at once. Its
    sequence number, timestamp and size too (``Peer.rtp_report``)."""
    handle = receiver._handle_rtp_packet

    async def timed(packet: Any, arrival_time_ms: int) -> None:
        peer.packets_at.append(time.monotonic())
        peer.rtp.append((packet.sequence_number, packet.timestamp, len(packet.payload)))
        await handle(packet, arrival_time_ms)

    receiver._handle_rtp_packet = timed


async def make_offer(*, data_channel: bool = True, audio: str | None = "sendrecv") -> tuple[RTCPeerConnection, str]:
    """A real aiortc offer: a data channel or not, and audio ``sendrecv``, ``sendonly``, ``recvonly``
    or none. The caller closes the peer connection (its candidates are real sockets)."""
    pc = RTCPeerConnection()
    if data_channel:
        pc.createDataChannel("chat", ordered=True)
    if audio == "recvonly":
        pc.addTransceiver("audio", direction="recvonly")
    elif audio is not None:
        transceiver = pc.addTransceiver(ClipTrack(), direction="sendrecv")
        transceiver.direction = audio
    await pc.setLocalDescription(await pc.createOffer())
    return pc, pc.localDescription.sdp


async def connect_call(
    server: Any,
    session: dict[str, Any] | None = None,
    *,
    raw_sdp: bool = False,
    direction: str = "sendrecv",
    api_key: str = "unused",
) -> tuple[Peer, str]:
    """An OpenAI Realtime WebRTC call: the offer posted to /v1/realtime/calls with the openai SDK (the
    multipart form with ``session``; ``api_key`` as its key, a client secret say) or as a raw
    application/sdp body; events on ``oai-events``. Returns the peer and the call's Location."""
    import openai

    pc = RTCPeerConnection()
    channel = pc.createDataChannel("oai-events", ordered=True)
    track = ClipTrack()
    sender = pc.addTransceiver(track, direction=direction).sender  # "sendonly": no answers' audio
    peer = Peer(pc, channel, sender, track)
    opened = asyncio.Event()
    channel.on("open", opened.set)

    @pc.on("track")
    def on_track(remote: MediaStreamTrack) -> None:
        peer.remote_tracks += 1
        peer._readers.append(asyncio.get_running_loop().create_task(peer._read_remote(remote)))

    @channel.on("message")
    def on_message(data: str) -> None:
        peer.messages.put_nowait(json.loads(data))

    await pc.setLocalDescription(await pc.createOffer())
    offer = pc.localDescription.sdp
    if raw_sdp:
        async with (
            aiohttp.ClientSession() as http,
            http.post(
                f"{server.url}/v1/realtime/calls", data=offer, headers={"Content-Type": "application/sdp"}
            ) as resp,
        ):
            assert resp.status == 201, await resp.text()
            assert resp.content_type == "application/sdp"
            answer, location = await resp.text(), resp.headers["Location"]
    else:
        client: Any = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key=api_key, max_retries=0)
        raw = await client.realtime.calls.with_raw_response.create(
            sdp=offer, **({"session": session} if session is not None else {})
        )
        assert raw.status_code == 201, raw.text
        answer, location = raw.parse().text, raw.headers["location"]
    await pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
    for receiver in pc.getReceivers():
        _time_packets(receiver, peer)
    await asyncio.wait_for(opened.wait(), timeout=15)
    return peer, location


# aiortc's audio receiver holds this many frames before passing the oldest on: the last frames of an
# answer stay in the client's jitter buffer until more arrive (rtcrtpreceiver.py, JitterBuffer).
CLIENT_JITTER_HOLD = 4


def answer_tracks(app: Any) -> list[Any]:
    """The server's answer tracks (``AssistantAudioTrack``), over all sessions."""
    from mediaserver.state import SESSIONS
    from mediaserver.transport.rtc_peer.audio import AssistantAudioTrack

    tracks = []
    for session_id in app[SESSIONS].ids():
        pc = getattr(getattr(app[SESSIONS].get(session_id), "peer", None), "pc", None)
        for sender in pc.getSenders() if pc is not None else ():
            if isinstance(sender.track, AssistantAudioTrack):
                tracks.append(sender.track)
    return tracks


def answer_frames_sent(app: Any) -> int:
    """Frames the server's answer tracks have sent, over all sessions."""
    return sum(track.frames_sent for track in answer_tracks(app))


def record_answer_audio(app: Any) -> list[bytes]:
    """The PCM16 (48 kHz mono) of every frame the server's answer tracks send from now on, over all
    sessions (``AssistantAudioTrack.on_sent``, chained to any hook already there): what was sent,
    to tell an answer garbled on its way from one synthesized garbled."""
    sent: list[bytes] = []
    for track in answer_tracks(app):
        before = track.on_sent

        def hook(pcm: bytes, before: Any = before) -> None:
            sent.append(pcm)
            if before is not None:
                before(pcm)

        track.on_sent = hook
    return sent


async def answer_frames_arrived(peer: Peer, app: Any, timeout_s: float = 15.0) -> None:
    """Wait until ``peer`` has received the frames the server sent (all but those aiortc's jitter
    buffer keeps): the last frames in flight, waited for rather than slept for."""
    started = time.monotonic()
    while len(peer.received) < answer_frames_sent(app) - CLIENT_JITTER_HOLD:
        if time.monotonic() - started > timeout_s:
            raise AssertionError(
                f"{len(peer.received)} answer frames arrived of {answer_frames_sent(app)} sent in {timeout_s:g} s"
            )
        await asyncio.sleep(0.02)
