"""An answered offer's audio receivers hold ``rtc_audio_jitter_frames`` frames, not aiortc's 4."""

from __future__ import annotations

import asyncio

import pytest
from aiortc import RTCPeerConnection
from aiortc.jitterbuffer import JitterBuffer
from aiortc.rtp import RtpPacket

from mediaserver.transport.rtc_peer.peer import answer_offer
from tests.rtc_peer import make_offer


def _buffer(pc: RTCPeerConnection) -> JitterBuffer:
    (transceiver,) = [t for t in pc.getTransceivers() if t.kind == "audio"]
    buffer = transceiver.receiver._RTCRtpReceiver__jitter_buffer  # type: ignore[attr-defined]
    assert isinstance(buffer, JitterBuffer)
    return buffer


def _passed_on(buffer: JitterBuffer, packets: int) -> int:
    """How many of ``packets`` consecutive 20 ms Opus packets the buffer has passed on."""
    out = 0
    for n in range(packets):
        packet = RtpPacket(payload_type=111, sequence_number=n, timestamp=960 * n, payload=b"x")
        packet._data = packet.payload  # type: ignore[attr-defined]  # what the receiver depacketizes
        _, frame = buffer.add(packet)
        out += frame is not None
    return out


@pytest.mark.parametrize("frames", [None, 1, 2])
def test_answer_offer_sets_the_audio_jitter_buffer(frames: int | None) -> None:
    async def run() -> JitterBuffer:
        client, offer = await make_offer()
        server = RTCPeerConnection()
        try:
            await answer_offer(
                server,
                offer,
                session_id="t",
                prepare=lambda: None,
                opus_dtx=True,
                idle_rtcp_interval_s=0,
                audio_jitter_frames=frames,
            )
            return _buffer(server)
        finally:
            await server.close()
            await client.close()

    buffer = asyncio.run(run())
    assert buffer.capacity == 16  # aiortc's capacity is kept: reordering still has room
    held = 4 if frames is None else frames  # None: aiortc's own buffer
    # A frame comes out once ``held`` newer packets are in (1: the next one shows it is whole).
    assert _passed_on(buffer, 10) == 10 - held
