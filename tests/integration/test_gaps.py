"""Hands-free streams that go quiet: Opus DTX, a paused track, a device that stops sending in
silence. An utterance must still end (and be transcribed) on time, without waiting for packets."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp
import numpy as np

from mediaserver.transport.rtc_peer.sdp import with_opus_dtx
from tests.conftest import SENTENCES, LiveServer
from tests.rtc_peer import connect


async def test_rtc_track_that_stops_sending_between_utterances(server: LiveServer, speech: Any, wer: Any) -> None:
    peer = await connect(server)
    try:
        peer.send("start", {"hands_free": True})
        await peer.next("log")
        peer.track.play(speech("kitchen"), silence_after_s=0.0)
        peer.track.go_quiet(2.5)  # no RTP at all after the sentence, as with DTX
        await peer.next("speech_stopped", timeout=30)
        stopped_at = time.monotonic()
        # The VAD ended the utterance while nothing was coming (a hangover after the speech), not
        # when packets came back.
        assert peer.track.quiet_from is not None and stopped_at < peer.track.quiet_from + 2.5, (
            "the utterance only ended once packets came back"
        )
        first = await peer.next("infer", timeout=30)
        assert wer(SENTENCES["kitchen"], first["obj"]["text"]) <= 0.2, first
        await asyncio.sleep(max(0.0, peer.track.quiet_from + 2.6 - time.monotonic()))  # sending again
        peer.track.play(speech("weather"), silence_after_s=1.0)
        second = await peer.next("infer", timeout=30)
        assert wer(SENTENCES["weather"], second["obj"]["text"]) <= 0.2, second  # its own final, not merged
    finally:
        await peer.close()


async def test_device_that_stops_sending_still_gets_its_final(server: LiveServer, speech: Any, wer: Any) -> None:
    clip = speech("remind")
    pcm = (np.clip(clip.audio16k, -1, 1) * 32767).astype("<i2").tobytes()
    async with aiohttp.ClientSession() as http, http.ws_connect(f"{server.url}/api/ws/asr") as ws:
        await ws.send_str(json.dumps({"type": "start", "mode": "server_vad"}))
        started = time.monotonic()
        for offset in range(0, len(pcm), 640):  # real time, 20 ms frames, then nothing at all
            await ws.send_bytes(pcm[offset : offset + 640])
            await asyncio.sleep(max(0.0, started + (offset + 640) / 32000 - time.monotonic()))
        stopped_sending = time.monotonic()
        messages: list[dict[str, Any]] = []
        async with asyncio.timeout(20):
            async for msg in ws:
                data = json.loads(msg.data)
                messages.append(data)
                if data["type"] == "final":
                    break
    kinds = [m["type"] for m in messages]
    assert kinds[-1] == "final" and "speech_stopped" in kinds, kinds
    final = messages[-1]
    assert wer(SENTENCES["remind"], final["text"]) <= 0.2, final
    # The utterance ended in stream time about a hangover after the speech, counting the gap as silence.
    speech_ms = 1000 * clip.audio16k.size / 16000
    assert final["audio_end_ms"] - speech_ms < 1500, final
    assert time.monotonic() - stopped_sending < 20


def test_opus_dtx_is_asked_for_in_the_answer() -> None:
    answer = (
        "v=0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 96 0 8\r\na=mid:0\r\na=rtpmap:96 opus/48000/2\r\n"
        "a=rtpmap:0 PCMU/8000\r\na=rtpmap:8 PCMA/8000\r\n"
    )
    out = with_opus_dtx(answer)
    assert "a=rtpmap:96 opus/48000/2\r\na=fmtp:96 usedtx=1;useinbandfec=1\r\na=rtpmap:0 PCMU/8000" in out
    assert "fmtp:0" not in out and "fmtp:8" not in out
    existing = answer.replace("a=rtpmap:0", "a=fmtp:96 minptime=10;useinbandfec=0\r\na=rtpmap:0")
    assert "a=fmtp:96 minptime=10;useinbandfec=1;usedtx=1\r\n" in with_opus_dtx(existing)
    assert with_opus_dtx("v=0\r\nm=audio 9 RTP/AVP 0\r\na=rtpmap:0 PCMU/8000\r\n").count("fmtp") == 0


async def test_rtc_answer_carries_dtx_unless_switched_off(server_factory: Any) -> None:
    for dtx in (True, False):
        live: LiveServer = await server_factory(rtc_opus_dtx=dtx)
        peer = await connect(live)
        try:
            sdp = peer.pc.remoteDescription.sdp
            assert ("usedtx=1" in sdp) is dtx, sdp
        finally:
            await peer.close()
