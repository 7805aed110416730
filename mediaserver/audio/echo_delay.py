"""Finding the echo's delay again after it jumps, faster than AEC3 does (issue #37, docs/echo.md).

AEC3 estimates the delay between the reference and its echo itself, but after the delay changes
(a device's player buffers more, a Bluetooth speaker reconnects) it needs seconds of echo to find
the new one, and lets that echo through meanwhile: ERLE falls from about 25 dB to 5 dB
(tools/echo_delay_track.py). Fed the reference re-aligned at the jump, so that it keeps seeing the
delay it converged on, it keeps about 33 dB. ``DelayTracker`` does that re-aligning: every
``hop`` it cross-correlates the last ``window`` of microphone audio with the reference as played
(GCC-PHAT: the cross-spectrum whitened, so the peak is sharp on speech), over delays 0 to
``max_delay``, while the answer sounds over at least half the window. The first sharp delay two
windows in a row agree on is the delay AEC3 converges on (the *baseline*). Then a window whose
sharp delay is later moves the reference AEC3 gets by the change (``shift``: the reference is kept
back that long), so that AEC3 sees the baseline again, but only while the canceller removes little
(``lost_db``: it has lost the echo) and the correlation has left the delay AEC3 has (a person
speaking over a steady echo, or a strong reflection, leaves it there). Acting on one window, not
two, finds a jump a quarter second sooner and made no wrong shift on tools/bench_echo.py's
sessions (tools/README.md, echo_delay_track.py). An earlier echo is left to AEC3: re-aligning for it
would need the reference ahead of the microphone, and an answer's first moments are sent only as
the microphone reaches them (AEC3 would get silence for them, at every answer). Where AEC3 finds a
new delay itself (the canceller removes the echo again at a delay that moved), two windows agreeing
move the baseline there.

Written here rather than taken from a library: the bindings of AEC3 expose neither its delay
estimator nor a delay hint that moves after it converged, and GCC-PHAT is a few lines of numpy
(1 s windows every 0.25 s: 1.5-3.3 ms of CPU per second of audio, beside the canceller's 16).
Two guards keep a reverberant room's reflections from moving it (stop 55): a move needs AEC3 to
have been seen removing the echo (``converged``) and a peak of ``MOVE_SHARPNESS``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

import numpy as np

from mediaserver.config import Settings
from mediaserver.events import SAMPLE_RATE_HZ, AudioArray

TRACK_WINDOW_S: Final = 1.0  # the default window (echo_delay_track_s; 0: off) and the defaults of
# echo_delay_track_max_ms and echo_delay_track_lost_db
TRACK_MAX_DELAY_MS: Final = 500.0
TRACK_LOST_DB: Final = 12.0
RESIDUAL_WINDOW_S: Final = 0.4  # ResidualEcho: the output's latest this long is compared
RESIDUAL_MIC_SHARPNESS: Final = 6.0  # ResidualEcho: the microphone's own peak at least this sharp
MIN_SHARPNESS: Final = 8.0  # a GCC-PHAT peak over the mean absolute correlation: below, no estimate
MOVE_SHARPNESS: Final = 12.0  # ... at least this sharp to move the reference (following AEC3: MIN_SHARPNESS)
REFERENCE_RMS: Final = 0.01  # a window whose reference is quieter than this (-40 dBFS) is not estimated
TOLERANCE_MS: Final = 2.0  # estimates this close are the same delay
HOPS_PER_WINDOW: Final = 4
SOUND_PEAK: Final = 0.003  # a 10 ms frame of answer audio with a sample louder than this (-50 dBFS) has sound
MIN_SOUND_SHARE: Final = 0.5  # a window is estimated only when this share of its frames have sound
STILL_THERE: Final = 0.5  # the correlation at the delay AEC3 has, against the new peak: above, it has not moved
FRAME_MIN: Final = SAMPLE_RATE_HZ // 100  # the shortest window or hop: one 10 ms frame


def gcc_phat(mic: AudioArray, reference: AudioArray, max_lag: int) -> tuple[int, float, np.ndarray]:
    """The delay (samples, the microphone behind the reference) of the sharpest GCC-PHAT peak from 0
    to ``max_lag``, its sharpness (the peak over the mean absolute correlation), and the correlation
    at each delay. Both end at the same sample; a ``reference`` longer than ``mic`` (by ``max_lag``:
    the tracker's) lets every delay compare the whole of ``mic``."""
    if reference.size > mic.size:
        mic = np.concatenate([np.zeros(reference.size - mic.size, np.float32), mic])
    # (Delays 0 to max_lag alone are read: a circular correlation this long has none of the rest
    # wrapped onto them, at half the cost of the whole linear correlation's length. The whitening
    # is per frequency bin, so the values differ a little from the longer FFT's: same lags, peaks
    # a few % less sharp; echo_delay_track.py's 24 sessions gave the same report either way.)
    n = 1 << int(np.ceil(np.log2(max(mic.size, reference.size + max_lag))))
    correlation = _phat(np.fft.rfft(mic, n) * np.conj(np.fft.rfft(reference, n)), n, max_lag)
    lag = int(np.argmax(correlation))
    return lag, float(correlation[lag] / (np.mean(np.abs(correlation)) + 1e-12)), correlation


def _sounding(reference: AudioArray) -> bool:
    """The answer audio has sound over at least ``MIN_SOUND_SHARE`` of the window's 10 ms frames, and
    is loud enough overall: a window with only the end of an answer at its start (the rest silence,
    the person barging in on the microphone) gives a sharp peak at a wrong delay."""
    frames = reference[: reference.size // FRAME_MIN * FRAME_MIN].reshape(-1, FRAME_MIN)
    share = float(np.mean(np.max(np.abs(frames), axis=1) > SOUND_PEAK))
    return share >= MIN_SOUND_SHARE and float(np.sqrt(np.mean(np.square(reference)))) >= REFERENCE_RMS


class DelayTracker:
    """The shift to apply to the reference AEC3 gets, from the microphone and the reference as played.

    ``push`` takes both for the same stream-clock samples (whole 10 ms frames) and how much the
    canceller took out of the microphone lately; ``shift`` (samples; positive: the reference goes
    to AEC3 that much later) changes only on a sharp delay away from the baseline, while the
    canceller removes less than ``lost_db`` and the correlation has left the current delay."""

    def __init__(self, window_s: float, max_delay_ms: float, *, lost_db: float = TRACK_LOST_DB) -> None:
        self.window = max(FRAME_MIN, int(window_s * SAMPLE_RATE_HZ))
        self.hop = max(FRAME_MIN, self.window // HOPS_PER_WINDOW)
        self.max_lag = max(0, int(max_delay_ms * SAMPLE_RATE_HZ / 1000))
        self.lost_db = lost_db
        self.tolerance = int(TOLERANCE_MS * SAMPLE_RATE_HZ / 1000)
        # Told of each change: ("moved", the delay AEC3 now sees the echo at, ms) when the reference
        # moved, ("followed", ...) when AEC3 found a new delay itself (the session counts and logs them).
        self.on_change: Callable[[str, float], None] | None = None
        self.reset()

    @classmethod
    def of(cls, settings: Settings) -> DelayTracker | None:
        """The tracker with the operator's ``echo_delay_track_*`` settings; None where it is off."""
        if settings.echo_delay_track_s <= 0:
            return None
        return cls(
            settings.echo_delay_track_s, settings.echo_delay_track_max_ms, lost_db=settings.echo_delay_track_lost_db
        )

    def reset(self) -> None:
        """A new stream: no baseline, no shift."""
        self.shift = 0
        self.baseline: int | None = None
        self.converged = False  # AEC3 was seen removing the echo at the delay it has
        self.shifts = 0  # how many times the shift changed
        self.rebaselines = 0  # how many times AEC3 was found on a new delay of its own
        self.estimates = 0  # windows estimated
        self._clear()

    def _clear(self) -> None:
        self._mic = np.zeros(0, np.float32)
        self._ref = np.zeros(0, np.float32)
        self._due = self.window
        self._previous: int | None = None

    def gap(self) -> None:
        """The microphone sent nothing for a while: the windows start again."""
        self._clear()

    def push(self, mic: AudioArray, reference: AudioArray, removed: Callable[[], float | None]) -> bool:
        """Audio for the same samples; ``removed()``: what the canceller took out of its latest
        output frames with sound (None: too few such frames, it leaves next to nothing), asked only
        where a window gives an estimate (a median over a second of frames: ~3 ms of CPU per
        second of audio when it was asked at every push). True when the shift changed."""
        self._mic = np.concatenate([self._mic, mic])[-self.window :]
        # The reference a longest delay further back: each delay compares the whole window.
        self._ref = np.concatenate([self._ref, reference])[-(self.window + self.max_lag) :]
        self._due -= mic.size
        if self._due > 0:
            return False
        self._due = self.hop
        if self._ref.size < self.window + self.max_lag or not _sounding(self._heard()):
            self._previous = None
            return False
        self.estimates += 1
        lag, sharpness, correlation = gcc_phat(self._mic, self._ref, self.max_lag)
        # (A peak at either end of the range is no peak: the echo's delay is past it, or the
        # reference is nearly silent there.)
        inside = self.tolerance <= lag <= self.max_lag - self.tolerance
        estimate = lag if sharpness >= MIN_SHARPNESS and inside else None
        previous, self._previous = self._previous, estimate
        if estimate is None:
            return False
        removed_db = removed()
        if self.baseline is None:  # the delay AEC3 converges on: two windows in a row agree on it
            if previous is not None and abs(estimate - previous) <= self.tolerance:
                self.baseline = estimate
            return False
        current = self.baseline + self.shift
        if abs(estimate - current) <= self.tolerance:
            if removed_db is None or removed_db >= self.lost_db:
                self.converged = True  # the echo where AEC3 has it, and removed: it had it
            return False
        if 0 <= current <= self.max_lag:
            around = correlation[max(0, current - self.tolerance) : current + self.tolerance + 1]
            if float(np.max(around)) > STILL_THERE * float(correlation[estimate]):
                return False  # the echo is still where AEC3 has it too (a person over it, a reflection)
        if removed_db is None or removed_db >= self.lost_db:
            # The echo moved, yet the canceller removes it: AEC3 found the new delay itself. Once two
            # windows agree, that is the delay it has (a later jump is measured from there), and AEC3
            # has had the echo (also where it found the delay before the tracker ever saw it removed).
            if previous is not None and abs(estimate - previous) <= self.tolerance:
                self.baseline = estimate - self.shift
                self.converged = True
                self.rebaselines += 1
                self._tell("followed", estimate)
            return False
        if not self.converged or sharpness < MOVE_SHARPNESS:
            # AEC3 still converging (it removes little anyway), or a peak only just sharp: in a
            # reverberant room a reflection's, 25-50 ms late (tools/bench_echo.py's steady sessions)
            return False
        # The echo comes later: AEC3 gets the reference that much later (kept back, up to max_lag).
        # Earlier than AEC3 has it: the reference would have to be read ahead of the microphone,
        # and an answer's first moments are sent only as the microphone reaches them: AEC3 finds
        # an earlier delay itself, and the baseline follows it (above).
        shift = min(self.max_lag, max(0, estimate - self.baseline))  # (the reference kept is max_lag long)
        if shift == self.shift:
            return False
        self.shift = shift
        self.shifts += 1
        self._tell("moved", estimate)
        return True

    def _heard(self) -> AudioArray:
        """The reference the window's microphone audio hears at the delay AEC3 has (before a baseline:
        half the longest delay)."""
        lag = self.max_lag // 2 if self.baseline is None else min(self.max_lag, self.baseline + self.shift)
        return self._ref[self.max_lag - lag : self.max_lag - lag + self.window]

    def _tell(self, change: str, delay: int) -> None:
        if self.on_change is not None:
            self.on_change(change, delay * 1000.0 / SAMPLE_RATE_HZ)


class ResidualEcho:
    """Whether what the canceller put out lately is still the answer's echo (the speech gate asks).

    Where AEC3 leaks (converging, a delay that moved, a sentence's first syllable), its output over
    the last ``window`` correlates with the reference at the delay the microphone itself does: GCC-
    PHAT of the output against the answer audio, read at the microphone's own sharpest delay, stands
    out of the rest of the correlation. A person speaking over the answer mostly does not
    (tools/echo_leaks.py ``--residual``; under an echo louder than them, live, often enough to lose
    their first words: docs/echo.md). ``sharpness`` is that reading: the output's correlation at the
    microphone's delay (within ``TOLERANCE_MS``) over its mean absolute correlation; 0 where the
    microphone shows no sharp delay; None where the answer audio was quiet over the window.
    Computed at 8 kHz, once per ``push``."""

    def __init__(self, window_s: float, max_delay_ms: float) -> None:
        self.window = max(FRAME_MIN, int(window_s * SAMPLE_RATE_HZ)) // 2 * 2
        self.max_lag = max(0, int(max_delay_ms * SAMPLE_RATE_HZ / 1000)) // 2 * 2
        self.latency = 0  # samples the output lags the microphone by (set by the canceller)
        self.reset()

    def reset(self) -> None:
        self._mic = np.zeros(0, np.float32)
        self._ref = np.zeros(0, np.float32)
        self._out = np.zeros(0, np.float32)
        self._cached: float | None = None
        self._fresh = False

    def push(self, mic: AudioArray, reference: AudioArray, out: AudioArray) -> None:
        """The microphone and the reference as played for the same samples, and the output the
        canceller made of them (``latency`` samples later)."""
        keep = self.window + self.max_lag + self.latency
        self._mic = np.concatenate([self._mic, mic])[-(self.window + self.latency) :]
        self._ref = np.concatenate([self._ref, reference])[-keep:]
        self._out = np.concatenate([self._out, out])[-self.window :]
        self._fresh = False

    def sharpness(self) -> float | None:
        if self._fresh:
            return self._cached
        self._fresh = True
        self._cached = self._measure()
        return self._cached

    def _measure(self) -> float | None:
        w, lag_max, late = self.window, self.max_lag, self.latency
        if self._ref.size < w + lag_max + late or self._out.size < w:
            return None
        ref = self._ref[: w + lag_max] if late == 0 else self._ref[-(w + lag_max + late) : -late]
        if float(np.sqrt(np.mean(np.square(ref[-w:])))) < REFERENCE_RMS:
            return None
        mic = self._mic[:w] if late == 0 else self._mic[-(w + late) : -late]
        pad = np.zeros(lag_max // 2, np.float32)
        ref8 = _half(ref)
        n = 1 << int(np.ceil(np.log2(2 * ref8.size)))
        reference = np.conj(np.fft.rfft(ref8, n))
        tolerance = max(1, int(TOLERANCE_MS * SAMPLE_RATE_HZ / 2000))
        mic_cc = _phat(np.fft.rfft(np.concatenate([pad, _half(mic)]), n) * reference, n, lag_max // 2)
        lag = int(np.argmax(mic_cc))
        if mic_cc[lag] / (np.mean(np.abs(mic_cc)) + 1e-12) < RESIDUAL_MIC_SHARPNESS:
            return 0.0
        out_cc = _phat(np.fft.rfft(np.concatenate([pad, _half(self._out)]), n) * reference, n, lag_max // 2)
        near = out_cc[max(0, lag - tolerance) : lag + tolerance + 1]
        return float(np.max(near) / (np.mean(np.abs(out_cc)) + 1e-12))


def _half(x: AudioArray) -> AudioArray:
    """16 kHz → 8 kHz (pairs averaged: enough for a correlation's peak)."""
    even = x[: x.size // 2 * 2]
    halved: AudioArray = 0.5 * (even[0::2] + even[1::2])
    return halved


def _phat(spectrum: np.ndarray, n: int, max_lag: int) -> np.ndarray:
    """A cross-spectrum whitened (PHAT) → the correlation at delays 0 to ``max_lag``."""
    spectrum = spectrum / (np.abs(spectrum) + 1e-12)
    correlation: np.ndarray = np.fft.irfft(spectrum, n)[: max_lag + 1]
    return correlation
