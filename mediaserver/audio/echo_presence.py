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

Decisions: echo as soon as the likeness reaches ``echo_likeness`` (kept for the stream: a device
that echoes once echoes again); no echo once ``min_sound_s`` of answer audio has been compared and
the likeness stays under ``quiet_likeness``, counting only answer audio whose echo would be in by
now at the longest delay (open to change at the next answer). Until then it is
undecided, and the canceller's output is used with its speech gate, as with ``on``.
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

    def __init__(self, echo_likeness: float = 0.85, quiet_likeness: float = 0.5, min_sound_s: float = 0.8) -> None:
        self.echo_likeness = echo_likeness
        self.quiet_likeness = quiet_likeness
        self.min_sound_frames = max(1, round(min_sound_s * 100))
        self.on_decide: Callable[[EchoPresence], None] | None = None  # told each new decision (the session)
        self._ref: deque[float] = deque(maxlen=WINDOW_FRAMES + MAX_DELAY_FRAMES)
        self._mic: deque[float] = deque(maxlen=WINDOW_FRAMES + MAX_DELAY_FRAMES)
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
        likeness = self.measure(ref, mic)
        self.likeness = likeness
        # No echo only from answer audio whose echo would be in by now at the longest delay.
        heard = int(np.count_nonzero(ref[:-MAX_DELAY_FRAMES] > SOUND_DB)) if ref.size > MAX_DELAY_FRAMES else 0
        if likeness >= self.echo_likeness:
            self._set(True)
        elif likeness < self.quiet_likeness and heard >= self.min_sound_frames:
            self._set(False)

    @staticmethod
    def measure(ref: np.ndarray, mic: np.ndarray) -> float:
        """The best correlation of ``mic``'s levels with ``ref``'s delayed 0 to ``MAX_DELAY_FRAMES``
        frames, over the window (all delays at once: running sums and one cross-correlation)."""
        n = min(ref.size, mic.size)
        ref, mic = ref[-n:], mic[-n:]
        lags = np.arange(0, min(MAX_DELAY_FRAMES, n - 2) + 1)
        if lags.size == 0:
            return 0.0
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
        if not ok.any():
            return 0.0
        return float(max(0.0, np.max(cov[ok] / np.sqrt(var[ok]))))
