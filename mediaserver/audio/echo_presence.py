"""Does this device's microphone hear the answers it plays? (``echo_cancellation: auto``, issue #37)

Many devices cancel their own echo (a Willow box, Home Assistant Voice PE, a speakerphone, a
browser); many do not (most ESP32 satellites, a laptop script). Run on a microphone that carries no
echo, AEC3 never finds an echo path and its suppressor keeps taking the person while the answer
plays (tools/echo_auto.py, tools/README.md: a person barging in during the first answer on such a
device is heard later, often not at all, and their words come out damaged). So ``auto`` runs the
canceller but uses its output only where the microphone is heard to carry the echo; elsewhere the
microphone passes (8 ms late, as the canceller's output is).

The evidence: the microphone's level follows the answer's. Per 10 ms frame the reference's and the
raw microphone's levels (dB, floored), over the last ``WINDOW_FRAMES``; their correlation at the
best delay (0 to ``MAX_DELAY_FRAMES``, 1 s) is the *likeness*. An echoing device's microphone rises
and falls with the answer's syllables at the device's delay (0.91-0.99 on every simulated device, a
person barging in included, 0.97-0.99 at 0.5-1 s late); a microphone with no echo holds its noise
floor (about 0) or a person's voice, which follows the answer by chance only (up to 0.74 at the
best of 101 delays). With delays searched only to 500 ms, devices 600 ms late read as no echo.
No library offers this: WebRTC's residual echo detector (which answers the same question) is not in
the binding.

Echo is found only at delays that compared at least ``min_compared_s`` of levels (2 s). On fewer
the correlation says nothing: two unrelated voices (a person appending their question over an
answer their client is not playing) correlated 1.0 at the delays that left two or three frames to
compare, and at best 0.96 / 0.86 / 0.73 / 0.62 on 0.5 / 1 / 1.5 / 2 s (17 real recordings against
5 Piper answers; tests/unit/test_echo_auto.py). Few frames only ever read higher, so no echo is
still decided on every delay, however little it compared.

Decisions: echo as soon as the likeness reaches ``echo_likeness`` (kept for the stream: a device
that echoes once echoes again); no echo once ``min_sound_s`` of answer audio has been compared and
the likeness stays under ``quiet_likeness``, counting only answer audio whose echo
would be in by now at the longest delay (open to change at the next answer). Until then it is
undecided, and the canceller's output is used with its speech gate, as with ``on``: so a decision
that waits costs an echoing device nothing.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Final

import numpy as np

WINDOW_FRAMES: Final = 300  # 3 s of 10 ms frames compared
MAX_DELAY_FRAMES: Final = 100  # 1 s: the device's buffers and the room (at 500 ms, devices 600 ms late read as none)
FLOOR_DB: Final = -70.0  # levels below this are this (a noise floor, digital silence)
SOUND_DB: Final = -60.0  # a reference frame above this has sound in it
EVERY_FRAMES: Final = 10  # the likeness is measured every 100 ms


class EchoPresence:
    """The likeness of a stream's microphone to the answers it is played, and what it says."""

    def __init__(
        self,
        echo_likeness: float = 0.85,
        quiet_likeness: float = 0.5,
        min_sound_s: float = 0.8,
        min_compared_s: float = 2.0,
    ) -> None:
        self.echo_likeness = echo_likeness
        self.quiet_likeness = quiet_likeness
        self.min_sound_frames = max(1, round(min_sound_s * 100))
        self.min_compared_frames = max(2, round(min_compared_s * 100))
        self.on_decide: Callable[[EchoPresence], None] | None = None  # told each new decision (the session)
        # (the window holds every delay's comparison: 3 s, or the least compared where that is more)
        kept = max(WINDOW_FRAMES, self.min_compared_frames) + MAX_DELAY_FRAMES
        self._ref: deque[float] = deque(maxlen=kept)
        self._mic: deque[float] = deque(maxlen=kept)
        self.reset()

    def reset(self) -> None:
        """A new stream: nothing heard, nothing decided."""
        self.echo: bool | None = None  # None: not decided yet
        self.likeness: float | None = None  # the latest measure
        self.streamed = False  # the audio came faster than real time: a file, not a microphone (``stream``)
        self._ref.clear()
        self._mic.clear()
        self._frames = 0

    def push(self, reference_power: list[float], mic_power: list[float]) -> None:
        """The mean squares of the next 10 ms frames of the reference and of the raw microphone (the
        same frames of the stream clock)."""
        for ref, mic in zip(reference_power, mic_power, strict=True):
            self._ref.append(max(FLOOR_DB, 10.0 * np.log10(ref + 1e-12)))
            self._mic.append(max(FLOOR_DB, 10.0 * np.log10(mic + 1e-12)))
            self._frames += 1
            if self._frames % EVERY_FRAMES == 0 and self.echo is not True and not self.streamed:
                self._decide()

    def stream(self) -> None:
        """The audio has come faster than real time (a file sent as fast as it is read, an SDK app
        appending a recording): no loudspeaker plays into it, so no echo."""
        if not self.streamed:
            self.streamed = True
            self._set(False)

    def settle(self) -> None:
        """Decide now, undecided, on what has been compared: no echo unless some delay already reads
        like the answer (``quiet_likeness`` or more). For a sender that stopped sending before the
        usual evidence was in (a client that appends only while its user speaks, over an answer it
        does not feed back): its held audio is then heard as it came (``EchoCanceller.release``)."""
        if self.echo is not None or self.streamed:
            return
        likeness, _ = self.likenesses(np.fromiter(self._ref, np.float64), np.fromiter(self._mic, np.float64))
        highest = float(np.max(likeness)) if likeness is not None and likeness.size else 0.0
        if highest < self.quiet_likeness:
            self._set(False)

    def _set(self, echo: bool) -> None:
        if echo != self.echo:
            self.echo = echo
            if self.on_decide is not None:
                self.on_decide(self)

    def _decide(self) -> None:
        ref = np.fromiter(self._ref, np.float64)
        mic = np.fromiter(self._mic, np.float64)
        sound = int(np.count_nonzero(ref[:-1] > SOUND_DB)) if ref.size > 1 else 0
        if sound < self.min_sound_frames // 2:
            return  # too little answer audio in the window to say anything
        likeness, compared = self.likenesses(ref, mic)
        if likeness is None:
            return
        enough = compared >= self.min_compared_frames
        # Echo only on delays compared over enough frames; no echo where no delay, however little it
        # compared, follows the answer (few frames only ever read higher). Reported: the former once
        # there are any.
        best = float(np.max(likeness[enough])) if enough.any() else None
        highest = float(np.max(likeness))
        self.likeness = best if best is not None else highest
        # No echo only from answer audio whose echo would be in by now at the longest delay.
        heard = int(np.count_nonzero(ref[:-MAX_DELAY_FRAMES] > SOUND_DB)) if ref.size > MAX_DELAY_FRAMES else 0
        if best is not None and best >= self.echo_likeness:
            self._set(True)
        elif highest < self.quiet_likeness and heard >= self.min_sound_frames:
            self._set(False)

    @staticmethod
    def likenesses(ref: np.ndarray, mic: np.ndarray) -> tuple[np.ndarray | None, np.ndarray]:
        """The correlation of ``mic``'s levels with ``ref``'s delayed 0 to ``MAX_DELAY_FRAMES`` frames
        over the window (at least 0 each), and how many frames each delay compared (all delays at
        once: running sums and one cross-correlation); None for a window of under 3 frames."""
        n = min(ref.size, mic.size)
        ref, mic = ref[-n:], mic[-n:]
        lags = np.arange(0, min(MAX_DELAY_FRAMES, n - 2) + 1)
        if lags.size == 0:
            return None, lags
        ref = ref - ref.mean()  # (correlation ignores offsets; this keeps the sums small)
        mic = mic - mic.mean()
        ra, ra2 = np.concatenate(([0.0], np.cumsum(ref))), np.concatenate(([0.0], np.cumsum(ref * ref)))
        mb, mb2 = np.concatenate(([0.0], np.cumsum(mic))), np.concatenate(([0.0], np.cumsum(mic * mic)))
        count = n - lags  # ref[: n - lag] against mic[lag:]
        sa, saa = ra[n - lags], ra2[n - lags]
        sb, sbb = mb[n] - mb[lags], mb2[n] - mb2[lags]
        sab = np.correlate(mic, ref, "full")[n - 1 + lags]
        cov = sab - sa * sb / count
        var = (saa - sa * sa / count) * (sbb - sb * sb / count)
        ok = var > 1e-9 * count * count
        likeness = np.zeros(lags.size)
        likeness[ok] = np.maximum(0.0, cov[ok] / np.sqrt(var[ok]))
        return likeness, count
