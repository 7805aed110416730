"""Outbound assistant audio: a queue of fixed-size PCM frames that a transport drains.

The turn pipeline writes each synthesized sentence here; the transport takes frames as fast as it
plays them (a WebRTC track's ``recv``, a socket sender paced at real time). Nothing is produced
while the queue is empty: an idle session sends no audio at all, not silence. ``clear`` drops
everything not yet taken (barge-in), and ``taken_samples`` says how far playback got, so the
pipeline can tell which part of its answer the user actually heard. ``pause`` holds what is queued
(nothing is taken) until ``resume``: a barge-in being judged (stream/echo_check.py). ``duck`` plays it
on quieter instead (a suspect start waiting to be long enough to judge: stream/barge_in.py).
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

_MAX_MARKS = 256


@dataclass(frozen=True)
class Mark:
    """A sentence's place in the outbound stream: samples ``[start, end)`` since the stream began."""

    text: str
    start: int
    end: int


def played_text(marks: Iterable[Mark], until: int, *, since: int = 0) -> str:
    """The text of the audio in samples ``[since, until)``: the sentences wholly inside, and the one
    ``until`` falls into cut in proportion (at a word boundary). What a user heard when playback
    stopped at ``until``, or what is left of an answer truncated there."""
    parts: list[str] = []
    for mark in marks:
        if mark.end <= since or not mark.text:
            continue
        if mark.end <= until:
            parts.append(mark.text)
        elif mark.start < until:
            share = (until - mark.start) / max(1, mark.end - mark.start)
            words = mark.text.split()
            parts.append(" ".join(words[: int(len(words) * share)]))
    return " ".join(p.strip() for p in parts if p.strip())


def cut_marks(marks: Iterable[Mark], at: int) -> list[Mark]:
    """``marks`` as if the stream stopped at sample ``at``: those wholly after it dropped, the one
    ``at`` falls into ending there with the words played of it (``played_text``)."""
    kept: list[Mark] = []
    for mark in marks:
        if mark.end <= at:
            kept.append(mark)
        elif mark.start < at:
            kept.append(Mark(played_text([mark], at), mark.start, at))
    return kept


class AudioOut:
    """Mono signed 16-bit PCM at ``sample_rate_hz``, in ``frame_ms`` frames (the last one padded)."""

    def __init__(self, sample_rate_hz: int, frame_ms: int = 20) -> None:
        self.sample_rate_hz = sample_rate_hz
        self.frame_samples = sample_rate_hz * frame_ms // 1000
        self._frame_bytes = self.frame_samples * 2
        self._frames: collections.deque[bytes] = collections.deque()
        self._partial = b""
        self._available = asyncio.Event()
        self._empty = asyncio.Event()
        self._empty.set()
        self.written_samples = 0  # everything ever queued (cleared audio included)
        self.taken_samples = 0  # everything a transport took (played, or on its way)
        self.marks: list[Mark] = []
        self._waiters: list[tuple[int, asyncio.Future[float]]] = []
        self._closed = False
        self._paused = False
        self._gain = 1.0  # applied to each frame taken (``duck``)
        self._taken_gain = 1.0  # the gain the last frame taken ended at (a change ramps over one frame)
        # The last frame taken ramped the gain up (a duck ended): the echo's onset there leaks as
        # a playback restart's does (``EchoLine.sent``'s ``louder``).
        self.rose = False
        self.taken_at: float | None = None  # when the latest frame was taken (monotonic)

    @property
    def queued_samples(self) -> int:
        return len(self._frames) * self.frame_samples + len(self._partial) // 2

    @property
    def busy(self) -> bool:
        """Audio is queued (the assistant is talking)."""
        return bool(self._frames or self._partial)

    def write(self, pcm: bytes, text: str = "") -> Mark:
        """Queue audio; ``text`` is what it says. Returns where it sits in the stream."""
        start = self.written_samples
        self.written_samples += len(pcm) // 2
        mark = Mark(text, start, self.written_samples)
        if len(self.marks) >= _MAX_MARKS:  # a long session: forget what was played long ago
            self.marks = [m for m in self.marks if m.end > self.taken_samples]
        self.marks.append(mark)
        data = self._partial + pcm
        whole = len(data) - len(data) % self._frame_bytes
        for offset in range(0, whole, self._frame_bytes):
            self._frames.append(data[offset : offset + self._frame_bytes])
        self._partial = data[whole:]
        if self.busy:
            self._empty.clear()
            if not self._paused:
                self._available.set()
        return mark

    def end_of_answer(self) -> None:
        """The answer is complete: pad the last partial frame and add one frame of silence, which
        pushes the answer's true end through an encoder's look-ahead (Opus holds back ~20 ms)."""
        if self._partial:
            self.written_samples += self.frame_samples - len(self._partial) // 2  # the padding
            self._frames.append(self._partial.ljust(self._frame_bytes, b"\x00"))
            self._partial = b""
        self._frames.append(bytes(self._frame_bytes))
        self.written_samples += self.frame_samples
        self._empty.clear()
        if not self._paused:
            self._available.set()

    @property
    def paused(self) -> bool:
        return self._paused

    def pause(self) -> None:
        """Hold the queued audio: nothing is taken until ``resume`` (or ``clear``); more may be written."""
        self._paused = True
        self._available.clear()

    def resume(self) -> None:
        """Take the held audio again, from where it paused."""
        self._paused = False
        if self.busy:
            self._available.set()

    @property
    def ducked(self) -> bool:
        return self._gain != 1.0

    def duck(self, db: float) -> None:
        """Play the audio on ``db`` dB quieter (0: as written) from the next frame taken; the gain
        moves over that frame, so the step makes no click."""
        self._gain = float(10.0 ** (-max(0.0, db) / 20.0))

    def _scaled(self, frame: bytes) -> bytes:
        if self._gain == self._taken_gain == 1.0:
            return frame
        samples = np.frombuffer(frame, dtype="<i2").astype(np.float32)
        gain = np.linspace(self._taken_gain, self._gain, samples.size, dtype=np.float32)
        self.rose = self._gain > self._taken_gain
        self._taken_gain = self._gain
        return bytes(np.clip(np.rint(samples * gain), -32768, 32767).astype("<i2").tobytes())

    def clear(self) -> int:
        """Drop everything not taken yet (barge-in); returns how many samples were dropped.

        The dropped audio was never taken, so the stream's positions go on from where playback
        stopped (``written_samples`` is ``taken_samples`` again): the next answer's marks line up
        with what is taken of it. The marks of what was dropped go; the sentence cut keeps the words
        played of it."""
        dropped = self.queued_samples
        self.written_samples -= dropped
        self.marks = cut_marks(self.marks, self.taken_samples)
        self._frames.clear()
        self._partial = b""
        self._paused = False
        self._gain = self._taken_gain = 1.0
        self._available.clear()
        self._empty.set()
        return dropped

    def take(self) -> bytes | None:
        """The next frame if one is queued (and not paused), else None (never blocks)."""
        if self._paused:
            return None
        if not self._frames:
            if not self._partial:
                self._available.clear()
                self._empty.set()
            return None
        self.rose = False
        frame = self._scaled(self._frames.popleft())
        self.taken_samples += self.frame_samples
        self.taken_at = time.monotonic()
        if self._waiters:
            self._wake(self.taken_at)
        if not self.busy:
            self._available.clear()
            self._empty.set()
        return frame

    async def ready(self) -> None:
        """Wait until a frame can be taken (forever while idle: an idle session sends nothing);
        EOFError once closed."""
        while self._paused or not self._frames:
            if self._closed:
                raise EOFError("the outbound audio was closed")
            self._available.clear()
            await self._available.wait()

    async def next_frame(self) -> bytes:
        """Wait for the next frame, and take it."""
        while True:
            await self.ready()
            frame = self.take()
            if frame is not None:
                return frame

    async def taken(self, sample_index: int) -> float:
        """Wait until the frame holding ``sample_index`` has been taken; returns when (monotonic)."""
        if self.taken_samples > sample_index:
            return time.monotonic()
        future: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self._waiters.append((sample_index, future))
        return await future

    def _wake(self, now: float) -> None:
        still: list[tuple[int, asyncio.Future[float]]] = []
        for index, future in self._waiters:
            if future.done():
                continue
            if self.taken_samples > index:
                future.set_result(now)
            else:
                still.append((index, future))
        self._waiters = still

    async def drained(self) -> None:
        """Wait until everything queued has been taken (or cleared)."""
        await self._empty.wait()

    def heard(self, since: int = 0) -> str:
        """The text of what was taken since sample ``since``: whole sentences, and the sentence
        being played cut in proportion to how much of it was played (at a word boundary)."""
        return played_text(self.marks, self.taken_samples, since=since)

    def close(self) -> None:
        self._closed = True
        self.clear()
        self._available.set()
        for _, future in self._waiters:
            future.cancel()
        self._waiters = []
