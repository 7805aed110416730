"""Answer audio over a socket: frames sent as they come, at most a lead ahead of real time.

A socket (the device WebSocket's binary frames, Realtime's ``response.output_audio.delta`` events)
has no clock of its own, unlike a WebRTC track that plays one frame per 20 ms. Sent as fast as it is
synthesized, a whole answer would sit in the client's buffer, and a barge-in could not take back
what the user has not heard yet. So ``send_paced`` keeps the audio sent at most ``lead_s`` ahead of
real time: it sends what is ready, then sleeps until the next frame is due less the lead, so a
barge-in (``AudioOut.clear``) drops everything not sent and nothing is held back while it waits.
The first frame of an answer, or the first after a stall longer than ``RESYNC_S``, goes at once and
restarts the clock; with ``align`` (the server cancels the stream's echo: ``EchoLine.align_start``)
it first waits for that, so it goes out at a point of the device's clock the canceller knows.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Final

from mediaserver.assistant.audio_out import AudioOut

RESYNC_S: Final = 0.1


async def send_paced(
    out: AudioOut,
    send: Callable[[bytes], None],
    *,
    lead_s: float,
    max_frames: int = 1,
    align: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """Drain ``out`` into ``send`` until ``out`` is closed. Each call of ``send`` carries one frame,
    or up to ``max_frames`` frames that were already queued, joined. ``align``, when given, is
    awaited before each frame is taken (it returns at once unless the frame starts playback afresh)."""
    frame_s = out.frame_samples / out.sample_rate_hz
    due: float | None = None
    while True:
        try:
            await out.ready()
        except EOFError:
            return
        if align is not None:
            await align()
        first = out.take()
        if first is None:
            continue  # paused or cleared (a barge-in) meanwhile
        frames = [first]
        while len(frames) < max_frames and (more := out.take()) is not None:
            frames.append(more)
        send(b"".join(frames))
        now = time.monotonic()
        if due is None or now - due > RESYNC_S:
            due = now
        due += len(frames) * frame_s
        if due - now > lead_s:
            await asyncio.sleep(due - now - lead_s)
