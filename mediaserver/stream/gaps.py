"""A stream's gaps: time without audio while someone speaks, heard as the silence it stands for.

A sender that stops sending mid-utterance (Opus DTX sends a packet every ~400 ms or none, a paused
track, a device that sends nothing in silence) must not keep the utterance open. ``GapFill`` watches
the wall clock while the segmenter is in speech: once no audio has come for ``stream_gap_fill_ms``,
it hands the segmenter the silence it would have heard, so an utterance ends
``stream_vad_hangover_ms`` after the speech whether or not packets keep coming. Only during speech:
the pre-roll before an onset keeps the real audio that arrived.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Final

import numpy as np

from mediaserver.events import SAMPLE_RATE_HZ, AudioArray

# Hears silence for a gap: the samples, and ``last_audio_at`` when the gap was measured.
HearSilence = Callable[[AudioArray, float], Awaitable[None]]
MAX_GAP_HEARD_S: Final = 10.0  # of a sender's gap under speech, heard as silence (the turn cap's 8 s and more)


async def hear_sender_gap(
    missing: int, listening: Callable[[], bool], hear: Callable[[AudioArray], Awaitable[None]]
) -> int:
    """A gap the sender says it left (``missing`` samples: Opus DTX's timestamps jumped) is heard
    as silence while someone speaks (``listening``), until the utterance ends, at most
    ``MAX_GAP_HEARD_S``: the samples heard (the rest of the gap only moves the stream's clock)."""
    heard = 0
    while missing > heard and listening() and heard < MAX_GAP_HEARD_S * SAMPLE_RATE_HZ:
        piece = min(missing - heard, SAMPLE_RATE_HZ // 2)
        await hear(np.zeros(piece, np.float32))
        heard += piece
    return heard


class GapFill:
    """One stream's gap watcher (``StreamSession``'s)."""

    def __init__(self, name: str, fill_ms: int, hear: HearSilence, in_speech: Callable[[], bool]) -> None:
        self._name = name
        self._fill_ms = fill_ms  # 0: off
        self._hear = hear
        self._in_speech = in_speech  # someone speaks on a live server-VAD stream
        self.last_audio_at = time.monotonic()
        self.filled_s = 0.0  # the silence already heard for the gap under way
        self.task: asyncio.Task[None] | None = None
        # Feeds under way: audio that came and waits (a pause being judged holds it) is not a gap.
        self._feeding = 0

    def audio_came(self) -> None:
        """Audio reached the session: any gap is over."""
        self.last_audio_at = time.monotonic()
        self.filled_s = 0.0

    def arriving(self) -> None:
        """Audio was received and is on its way to the session: the time until it is fed is no gap,
        and a gap before it is over (its silence heard is not taken off the next one: a review)."""
        self.last_audio_at = time.monotonic()
        self.filled_s = 0.0

    @contextlib.contextmanager
    def feeding(self) -> Iterator[None]:
        """Audio is being fed: the time a pause's judgement holds it back is not a gap in the sender's audio."""
        self._feeding += 1
        try:
            yield
        finally:
            self._feeding -= 1
            self.last_audio_at = time.monotonic()

    def outdated(self, gap_after: float) -> bool:
        """Silence measured for a gap after ``gap_after`` (``last_audio_at`` then) comes too late: audio came
        meanwhile, or is being fed (a review found such silence heard after that audio)."""
        return self.last_audio_at != gap_after or self._feeding > 0

    def watch(self) -> None:
        """Someone speaks: watch for a gap, unless already watching."""
        if self._fill_ms <= 0 or self.task is not None:
            return
        self.task = asyncio.get_running_loop().create_task(self._watch(), name=f"gaps-{self._name}")

    def cancel(self) -> None:
        if self.task is not None:
            self.task.cancel()
            self.task = None

    async def _watch(self) -> None:
        threshold_s = self._fill_ms / 1000.0
        # Time the event loop was too busy to wake this watcher on time (a loaded machine) is not the
        # sender's silence: audio sent meanwhile waits in the socket for the loop to read it.
        stalled_s, audio_at = 0.0, self.last_audio_at
        try:
            while self._in_speech():
                wake_at = time.monotonic() + threshold_s / 2
                await asyncio.sleep(threshold_s / 2)
                now = time.monotonic()
                if self.last_audio_at != audio_at:
                    stalled_s, audio_at = 0.0, self.last_audio_at
                stalled_s += max(0.0, now - max(wake_at, audio_at))
                silent_for = now - audio_at - stalled_s
                if silent_for <= threshold_s or self._feeding:
                    continue  # audio came, or is being fed: a pause being judged holds it
                missing = int((silent_for - self.filled_s) * SAMPLE_RATE_HZ)
                if missing <= 0:
                    continue
                self.filled_s += missing / SAMPLE_RATE_HZ
                await self._hear(np.zeros(missing, np.float32), audio_at)
        finally:
            if self.task is asyncio.current_task():
                self.task = None
