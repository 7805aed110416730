"""The assistant's outbound WebRTC audio track: TTS frames when there is an answer, nothing otherwise.

aiortc pulls frames with ``recv()`` and leaves pacing to the track. This one waits on the
session's ``AudioOut``: between answers it simply does not return, so no RTP is sent and an idle
session costs nothing in that direction (no silence frames). While an answer plays it releases one
20 ms frame per 20 ms of wall-clock time. Frame timestamps follow the wall clock from the track's
first frame, so after a pause of ten seconds the next packet's RTP timestamp is ten seconds later,
as a receiver's jitter buffer expects, rather than continuing where the last answer ended.
"""

from __future__ import annotations

import asyncio
import fractions
import time
from collections.abc import Callable

import av
import numpy as np
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from mediaserver.assistant.audio_out import AudioOut

RTC_SAMPLE_RATE_HZ = 48000
# A frame more than this late restarts the schedule (after a pause) instead of being rushed out.
_RESYNC_S = 0.1


class AssistantAudioTrack(MediaStreamTrack):
    kind = "audio"

    def __init__(self, out: AudioOut) -> None:
        super().__init__()
        if out.sample_rate_hz != RTC_SAMPLE_RATE_HZ:
            raise ValueError(f"WebRTC audio is {RTC_SAMPLE_RATE_HZ} Hz, got {out.sample_rate_hz}")
        self.out = out
        self._time_base = fractions.Fraction(1, out.sample_rate_hz)
        self._frame_s = out.frame_samples / out.sample_rate_hz
        self._origin: float | None = None  # wall-clock time of pts 0
        self._due: float | None = None  # when the next frame is due
        self.frames_sent = 0
        self.first_frame_at: float | None = None  # monotonic time the latest answer's first frame left
        self.on_sent: Callable[[bytes], None] | None = None  # each frame's PCM16 as it leaves (echo reference)

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        try:
            pcm = await self.out.next_frame()
        except EOFError:
            self.stop()
            raise MediaStreamError from None
        now = time.monotonic()
        if self._origin is None:
            self._origin = now
        if self._due is None or now - self._due > _RESYNC_S:
            self._due = now  # the first frame of an answer goes at once
            self.first_frame_at = now
        elif self._due > now:
            await asyncio.sleep(self._due - now)
        pts = round((self._due - self._origin) * self.out.sample_rate_hz)
        self._due += self._frame_s
        samples = np.frombuffer(pcm, dtype="<i2").reshape(1, -1)
        frame = av.AudioFrame.from_ndarray(samples, format="s16", layout="mono")
        frame.sample_rate = self.out.sample_rate_hz
        frame.pts = pts
        frame.time_base = self._time_base
        self.frames_sent += 1
        if self.on_sent is not None:
            self.on_sent(pcm)
        return frame
