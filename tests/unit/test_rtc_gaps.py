"""``read_audio_track``'s gaps (the server's echo canceller on WebRTC moves its clock on at each):
a sender whose timestamps go on where they stopped (aiortc's) shows a pause only as no frame for
``rtc_track_pause_ms``; one whose timestamps jump (Opus DTX) shows it in them."""

from __future__ import annotations

import asyncio
from fractions import Fraction

import av
import numpy as np
import pytest
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from mediaserver.transport.rtc_peer.peer import TRACK_PAUSE_S, read_audio_track

RATE = 48000
SAMPLES = 960  # 20 ms


class PausingTrack(MediaStreamTrack):
    """An audio track of 20 frames of 20 ms; before frame 10 it waits ``pause_s`` and its
    timestamp jumps by ``jump_s`` (0: it goes on where it stopped)."""

    kind = "audio"

    def __init__(self, pause_s: float, jump_s: float = 0.0) -> None:
        super().__init__()
        self.pause_s, self.jump_s, self.n = pause_s, jump_s, 0

    async def recv(self) -> av.AudioFrame:
        if self.n == 20:
            raise MediaStreamError
        if self.n == 10:
            await asyncio.sleep(self.pause_s)
        frame = av.AudioFrame.from_ndarray(np.zeros((1, SAMPLES), np.int16), format="s16", layout="mono")
        frame.sample_rate = RATE
        frame.time_base = Fraction(1, RATE)
        frame.pts = self.n * SAMPLES + (round(self.jump_s * RATE) if self.n >= 10 else 0)
        self.n += 1
        return frame


async def _gaps(track: PausingTrack, pause_s: float = TRACK_PAUSE_S) -> list[float]:
    gaps: list[float] = []

    async def feed(_: object) -> None:
        return None

    resampler = av.AudioResampler(format="flt", layout="mono", rate=16000)

    async def gap(seconds: float) -> None:
        gaps.append(seconds)

    await read_audio_track(track, resampler, feed, lambda: None, gap, pause_s=pause_s)
    return gaps


@pytest.mark.parametrize(("pause_s", "found"), [(0.1, True), (2.0, False)])
async def test_a_wait_is_a_gap_from_rtc_track_pause_ms(pause_s: float, found: bool) -> None:
    """0.3 s without a frame (timestamps going on) is a gap at 100 ms, not at 2 s (the default: 500)."""
    assert TRACK_PAUSE_S == 0.5
    gaps = await _gaps(PausingTrack(0.3), pause_s=pause_s)
    if found:
        assert len(gaps) == 1 and gaps[0] >= 0.3, gaps
    else:
        assert gaps == []


async def test_a_timestamp_jump_is_a_gap_whatever_the_wait() -> None:
    gaps = await _gaps(PausingTrack(0.0, jump_s=0.3))
    assert len(gaps) == 1 and gaps[0] == pytest.approx(0.3, abs=0.001), gaps


async def _skipped(track: PausingTrack) -> list[float]:
    skipped: list[float] = []

    async def feed(_: object) -> None:
        return None

    async def on_skipped(seconds: float) -> None:
        skipped.append(seconds)

    resampler = av.AudioResampler(format="flt", layout="mono", rate=16000)
    await read_audio_track(track, resampler, feed, lambda: None, on_skipped=on_skipped, pause_s=0.1)
    return skipped


async def test_only_a_timestamp_jump_is_time_the_sender_skipped() -> None:
    """The stream's clock (``on_skipped``) takes the sender's word only: a wait with the timestamps
    going on may be this server's loop held up (a review: a 0.72 s stall taken for a gap split an
    utterance in two), so it moves only the echo canceller's clock (``on_gap``, which takes it back
    when the frames then come at once); a jump counts whole."""
    assert await _skipped(PausingTrack(0.3)) == []
    [jump] = await _skipped(PausingTrack(0.3, jump_s=0.4))
    assert jump == pytest.approx(0.4, abs=0.001)
