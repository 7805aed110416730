"""A WebRTC client without echo cancellation (an aiortc peer on a loudspeaker, or a page that turned
the browser's ``echoCancellation`` off), over a real hands-free voice loop: the answer audio that
arrives on the server's track plays through a small clipping loudspeaker and a synthetic room back
into the microphone track, 150 ms late, in real time.

Without the server's canceller (``echo_cancellation`` off, WebRTC's default) the answer's echo is heard
as the user and cuts the answer. With it on (and barge-in off on that server, so that what AEC3 lets
through while it converges cuts nothing: docs/echo.md) none of the answer's words reaches a final,
and after a second in which the microphone sent nothing (timestamps following the clock) the next
question is heard.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import av
import numpy as np

from mediaserver.stream.echo_check import words
from tests.conftest import Clip, LiveServer
from tests.integration.test_echo_loop import VOICE_SETTINGS
from tests.rtc_peer import FRAME, RATE, ClipTrack, Peer, connect

DELAY = int(0.15 * RATE)  # loudspeaker to microphone, device buffers included
GAIN = 0.7


def room(rng: np.random.Generator, rt60_s: float = 0.2) -> np.ndarray:
    """A direct path and exponentially decaying noise, at 48 kHz, unit energy."""
    t = np.arange(int(rt60_s * RATE)) / RATE
    ir = rng.standard_normal(t.size) * np.exp(-6.91 * t / rt60_s) * 0.3
    ir[0] = 1.0
    unit: np.ndarray = (ir / np.sqrt(np.sum(ir**2))).astype(np.float32)
    return unit


class EchoingTrack(ClipTrack):
    """The microphone: what the user says, plus the loudspeaker playing the server's track."""

    def __init__(self) -> None:
        super().__init__()
        self.peer: Peer | None = None
        self._taken = 0  # frames of peer.received already queued on the loudspeaker
        self._speaker = np.zeros(0, np.float32)
        self._ir = room(np.random.default_rng(7))
        self._played = np.zeros(DELAY + self._ir.size + FRAME, np.float32)
        self._next_pts: int | None = None  # the timestamp the next frame has when none is skipped

    def _listen(self) -> None:
        """Queue on the loudspeaker what the server's track brought since."""
        if self.peer is not None:
            fresh = self.peer.received[self._taken :]
            self._taken += len(fresh)
            parts = [self._speaker, *(r.pcm.astype(np.float32) / 32768.0 for r in fresh)]
            self._speaker = np.concatenate(parts)

    def _play(self, samples: int) -> None:
        now, self._speaker = self._speaker[:samples], self._speaker[samples:]
        played = np.concatenate([self._played, np.pad(now, (0, samples - now.size))])
        self._played = played[-(DELAY + self._ir.size + FRAME) :]

    async def recv(self) -> av.AudioFrame:
        frame = await super().recv()
        self._listen()
        if self._next_pts is not None and frame.pts is not None and frame.pts > self._next_pts:
            self._play(frame.pts - self._next_pts)  # the microphone sent nothing; the loudspeaker played on
        self._next_pts = None if frame.pts is None else frame.pts + FRAME
        self._play(FRAME)
        source = self._played[-(DELAY + FRAME + self._ir.size) : -DELAY]
        echo = np.convolve(source, self._ir)[self._ir.size : self._ir.size + FRAME] * GAIN
        user = frame.to_ndarray().reshape(-1).astype(np.float32) / 32768.0
        mic = np.clip(np.tanh(echo * 1.5) / 1.5 + user, -1, 1)
        out = av.AudioFrame.from_ndarray((mic * 32767).astype(np.int16).reshape(1, -1), format="s16", layout="mono")
        out.sample_rate, out.pts, out.time_base = frame.sample_rate, frame.pts, frame.time_base
        return out

    @property
    def speaker_idle(self) -> bool:
        return not self._speaker.size and not np.any(self._played)


async def echoing_peer(server: LiveServer, echo_cancellation: str | None) -> tuple[Peer, EchoingTrack]:
    """A hands-free voice loop; ``echo_cancellation`` None: the start does not say (the server's
    ``rtc_echo_cancellation_default``)."""
    track = EchoingTrack()
    peer = await connect(server, track=track)
    track.peer = peer
    start: dict[str, Any] = {"hands_free": True, "assistant": True}
    if echo_cancellation is not None:
        start["echo_cancellation"] = echo_cancellation
    peer.send("start", start)
    started = await peer.next("log")
    assert started["obj"]["echo_cancellation"] is (echo_cancellation in ("on", None)), started
    return peer, track


async def until_kind(peer: Peer, kinds: tuple[str, ...], seen: list[dict[str, Any]], timeout: float = 60.0) -> None:
    async with asyncio.timeout(timeout):
        while True:
            message = await peer.next()
            seen.append(message)
            if message["type"] in kinds:
                return


async def test_without_echo_cancellation_the_answer_interrupts_itself(
    server_factory: Callable[..., Any], speech: Callable[[str], Clip]
) -> None:
    server: LiveServer = await server_factory(**VOICE_SETTINGS)
    peer, track = await echoing_peer(server, "off")
    try:
        track.play(speech("What do cows eat?"), silence_after_s=0.5)
        seen: list[dict[str, Any]] = []
        await until_kind(peer, ("assistant_audio_stopped", "error"), seen)
        assert seen[-1]["type"] == "assistant_audio_stopped" and seen[-1]["obj"]["interrupted"] is True, seen[-1]
    finally:
        await peer.close()


def finals(seen: list[dict[str, Any]]) -> list[str]:
    return [str(m["obj"]["text"]) for m in seen if m["type"] == "infer"]


def answering(seen: list[dict[str, Any]]) -> bool:
    """An answer's audio started and has not stopped."""
    kinds = [m["type"] for m in seen if m["type"] in ("assistant_audio_started", "assistant_audio_stopped")]
    return bool(kinds) and kinds[-1] == "assistant_audio_started"


async def test_with_echo_cancellation_the_answer_is_not_heard_as_the_user(
    server_factory: Callable[..., Any], speech: Callable[[str], Clip]
) -> None:
    """With barge-in off on this server, what the canceller lets through can only be transcribed (a
    final with words is still answered, as any final is): none of the answers' words reaches a final,
    and after a second without microphone packets the next question is heard. The peer does not ask:
    this server's ``rtc_echo_cancellation_default`` is auto (the default, off, is for browsers)."""
    server: LiveServer = await server_factory(
        **VOICE_SETTINGS, assistant_barge_in=False, rtc_echo_cancellation_default="auto"
    )
    peer, track = await echoing_peer(server, None)
    seen: list[dict[str, Any]] = []

    async def until(check: Callable[[], bool], timeout_s: float = 60.0) -> None:
        try:
            async with asyncio.timeout(timeout_s):
                while not check():
                    with contextlib.suppress(TimeoutError):
                        seen.append(await peer.next(timeout=0.1))
        except TimeoutError:
            story = [(m["type"], m["obj"].get("text") or m["obj"].get("full") or m["obj"]) for m in seen]
            raise AssertionError(f"waited {timeout_s} s; the session said: {story}") from None

    try:
        track.play(speech("What do cows eat?"), silence_after_s=0.5)
        await until(lambda: any(m["type"] == "assistant_audio_started" for m in seen))
        await until(lambda: not answering(seen) and track.speaker_idle and track.played.is_set())
        # No microphone packets for a second, timestamps following the clock (Opus DTX in silence):
        # the canceller's clock moves on with it.
        track.go_quiet(1.0)
        track.play(speech("What do bees make?"), silence_after_s=0.5)
        await until(lambda: any("bees" in text.lower() for text in finals(seen)))
        answers = [str(m["obj"]["full"]) for m in seen if m["type"] == "assistant" and m["obj"]["final"]]
        heard = finals(seen)
        print(f"answers {answers}; finals {heard}")
        said = {w for w in words(" ".join(answers)) if len(w) >= 4} - {"cows", "bees", "what", "make"}
        assert len(said) >= 3 and "cows" in heard[0].lower(), (answers, heard)
        echoed = said & set(words(" ".join(heard[1:])))
        assert not echoed, f"the answers' words {echoed} reached a final: {heard}"
    finally:
        await peer.close()
