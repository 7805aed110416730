"""Server-side acoustic echo cancellation for devices that have none (issue #37).

The server knows what it played to a device (it synthesized it): that audio is the *reference*.
Its echo reaches the device's microphone after an unknown, varying delay (device buffers, 20-300+
ms), through a room, with gain and loudspeaker clipping. ``EchoCanceller`` removes it before the
VAD and ASR see the microphone audio.

The canceller is WebRTC's AEC3 through ``pywebrtc-audio`` (Apache-2.0; WebRTC itself BSD-3-Clause;
a 0.4 MB manylinux wheel whose only dependency is numpy). It was chosen by measurement against
LiveKit's AEC3 binding and speexdsp (``tools/bench_echo.py``, docs/echo.md). AEC3 estimates the
echo delay itself (its matched-filter delay estimator, which also follows a delay that changes,
after a few seconds of echo), so the reference is handed over on the stream clock as played, with
no delay hint.

Stream clock: sample ``n`` of the reference is what the server sent to the device for the moment
at which microphone sample ``n`` arrives (the device's clock counted in received microphone
samples). ``played(samples, at_sample)`` records an answer's audio there; silence between answers
is simply nothing recorded; an answer cut short stops being recorded (``cut(at_sample)`` also drops
reference already recorded past a point, e.g. audio queued but never sent).

Latency: whole 10 ms frames go through; up to one frame (159 samples) is held until the next piece
arrives; AEC3 itself delays its output by 128 samples (8 ms, two of its 4 ms blocks).
"""

from __future__ import annotations

from collections import deque
from itertools import islice
from typing import Any, Final, Literal

import numpy as np

from mediaserver.audio.denormals import call_flushed
from mediaserver.audio.echo_delay import DelayTracker, ResidualEcho
from mediaserver.audio.echo_presence import EchoPresence
from mediaserver.audio.segmenter import level_dbfs
from mediaserver.config import Settings
from mediaserver.errors import InvalidParameter
from mediaserver.events import SAMPLE_RATE_HZ, AudioArray

EchoMode = Literal["auto", "on", "off"]

FRAME_SAMPLES: Final = SAMPLE_RATE_HZ // 100  # 10 ms, AEC3's frame
OUTPUT_LATENCY_SAMPLES: Final = 128  # AEC3's own delay of the output (measured, tools/bench_echo.py)
MAX_REFERENCE_AHEAD_S: Final = 120.0  # reference recorded further ahead than this is refused
MEASURE_FRAMES: Final = 60 * 100  # the last minute of (microphone, output) frame energies is kept
ACTIVE_FRAME_DBFS: Final = -50.0  # output frames quieter than this are silence: not measured
MIN_ACTIVE_FRAMES: Final = 3  # fewer active frames than this in a span: no measure
REFERENCE_SOUND: Final = 1e-3  # reference frames with a sample louder than this (-60 dBFS) are sound
ONSET_GAP_MS: Final = 100.0  # reference quiet this long, then sound: an onset (echo_speech_gate_onset_gap_ms)
MAX_STRETCHES: Final = 64  # stretches of reference sound remembered (onsets further back are not asked for)
NEVER_FRAMES: Final = 1 << 30  # the quiet before the first sound: longer than any gap
RESIDUAL_LOG_FRAMES: Final = 3000  # SpeechGate: the residual notes of this many segmenter frames are kept
TRACK_REMOVED_MS: Final = 500  # the tracker shifts only while the canceller removed little over this long


class EchoCanceller:
    """AEC3 for one stream: ``played`` records the reference, ``process`` cleans the microphone."""

    def __init__(
        self,
        sample_rate: int = SAMPLE_RATE_HZ,
        *,
        detect: EchoPresence | None = None,
        tracker: DelayTracker | None = None,
        residual: ResidualEcho | None = None,
        hold_undecided_ms: float = 0.0,
    ) -> None:
        """``detect``: ``echo_cancellation: auto``: the output is the canceller's only where the
        microphone is heard to carry the echo (audio/echo_presence.py); elsewhere the microphone
        passes, as late as the canceller's output. ``tracker``: re-aligns the reference AEC3 gets
        after the echo's delay jumps (audio/echo_delay.py); None: AEC3 alone follows it. ``residual``:
        measures whether the output is still the echo, for the speech gate (audio/echo_delay.py).
        ``hold_undecided_ms``: with ``detect``, the output waits (up to this long, once a stream)
        while ``detect`` has not decided, and is then put out as decided (``_hold``); 0: at once."""
        if sample_rate != SAMPLE_RATE_HZ:
            raise ValueError(f"EchoCanceller runs at {SAMPLE_RATE_HZ} Hz, got {sample_rate}")
        self._aec: Any = None
        self.detect = detect
        self.hold_undecided_samples = int(hold_undecided_ms * SAMPLE_RATE_HZ / 1000)
        self.tracker = tracker
        self.residual = residual
        if residual is not None:
            residual.latency = OUTPUT_LATENCY_SAMPLES
        self.reset()

    def reset(self) -> None:
        """A new stream: forget the reference, the held audio, the filter and the delay."""
        from pywebrtc_audio import EchoCanceller as Aec3

        self._aec = Aec3(SAMPLE_RATE_HZ, 1, 0)
        self._position = 0  # stream clock: microphone samples taken so far (held ones included)
        self._carry = np.zeros(0, np.float32)  # microphone samples waiting for a whole frame
        self._next = 0  # stream-clock sample of the next frame to process
        self._ref_start = 0  # stream-clock sample of self._ref[0] (the tracker's shift reads back from _next)
        self._ref = np.zeros(0, np.float32)
        self._active = False  # has any reference been recorded since the reset?
        self._mic_tail = np.zeros(OUTPUT_LATENCY_SAMPLES, np.float32)  # microphone samples AEC3's output lags by
        self._removed: deque[tuple[float, float]] = deque(maxlen=MEASURE_FRAMES)  # (mic, output) mean square
        self._processed_to = 0  # stream clock at the end of the audio put out so far
        self._reference_to: int | None = None  # ... and at the end of the last reference frame with sound
        self._sound_frames = 0  # 10 ms frames of reference with sound processed since the reset
        self._quiet_frames = NEVER_FRAMES  # 10 ms frames of reference without sound since its last sound
        # The latest stretches of reference sound: (stream clock at the start, frames without sound before it).
        self._stretches: deque[tuple[int, int]] = deque(maxlen=MAX_STRETCHES)
        # ``_sound_frames`` after each 10 ms frame processed, the latest last (``reference_heard_s_at``).
        self._heard_log: deque[int] = deque(maxlen=MEASURE_FRAMES)
        # Output waiting for ``detect``'s decision: (the canceller's, the microphone's) per piece (``_hold``).
        self._held: list[tuple[AudioArray, AudioArray]] = []
        self._held_samples = 0
        self._hold_spent = False  # it waited ``hold_undecided_samples`` once: no more this stream
        self._restarts: deque[int] = deque(maxlen=MAX_STRETCHES)  # stream clock where playback started afresh
        self.shifted_at: int | None = None  # stream clock where the tracker last moved the reference
        if self.detect is not None:
            self.detect.reset()
        if self.tracker is not None:
            self.tracker.reset()
        if self.residual is not None:
            self.residual.reset()

    @property
    def passing(self) -> bool:
        """``auto`` found no echo on this microphone: it passes uncancelled (and ungated)."""
        return self.detect is not None and self.detect.echo is False

    @property
    def since_reference_ms(self) -> float | None:
        """How long before the end of the audio put out so far the reference last had sound in it
        (0 while it has); None: none yet. The echo of it can still be arriving for the device's
        delay and the room's reverberation after that."""
        return None if self._reference_to is None else self._ms_before_end(self._reference_to)

    def _ms_before_end(self, sample: int) -> float:
        """How long before the end of the audio put out so far stream-clock ``sample`` is."""
        return max(0, self._processed_to - sample) * 1000.0 / SAMPLE_RATE_HZ

    def since_onset_ms(self, gap_ms: float) -> float | None:
        """How long before the end of the audio put out so far the reference's latest onset began: sound
        after at least ``gap_ms`` without any (a sentence's or a clause's first syllable, where AEC3
        leaks most once converged: tools/README.md, echo_leaks.py); None: none among its latest
        ``MAX_STRETCHES`` stretches of sound."""
        gap_frames = gap_ms / 10.0
        for start, quiet in reversed(self._stretches):
            if quiet >= gap_frames:
                return self._ms_before_end(start)
        return None

    def restarted(self, at_sample: int) -> None:
        """The device starts playing afresh at stream-clock ``at_sample`` (answer audio after a
        stretch without any: ``EchoLine.sent``): where the echo's delay may have moved by a frame
        or so since the audio before."""
        self._restarts.append(at_sample)

    def since_restart_ms(self) -> float | None:
        """How long before the end of the audio put out so far playback last started afresh; None:
        not since the reset, or only later than that end."""
        for at in reversed(self._restarts):
            if at <= self._processed_to:
                return self._ms_before_end(at)
        return None

    @property
    def reference_heard_s(self) -> float:
        """Seconds of answer audio with sound in it that the canceller has processed since its reset:
        how far its filter has had the chance to converge."""
        return self._sound_frames * FRAME_SAMPLES / SAMPLE_RATE_HZ

    def reference_heard_s_at(self, after: int) -> float:
        """``reference_heard_s`` as it was ``after`` samples before the end of the audio put out so
        far (the speech gate asks about frames put out late, after waiting for ``detect``)."""
        back = after // FRAME_SAMPLES
        if back <= 0 or not self._heard_log:
            return self.reference_heard_s
        frames = self._heard_log[-1 - back] if back < len(self._heard_log) else 0
        return frames * FRAME_SAMPLES / SAMPLE_RATE_HZ

    @property
    def holding(self) -> int:
        """Samples of output waiting for ``detect``'s decision."""
        return self._held_samples

    @property
    def position(self) -> int:
        """Microphone samples taken since the reset (the stream clock)."""
        return self._position

    def played(self, samples16k: AudioArray, at_sample: int) -> None:
        """The server sent ``samples16k`` (16 kHz float32) to the device, starting at stream-clock
        sample ``at_sample``. Overlapping audio is mixed (added); audio before the frame in progress
        is too late to use and is dropped."""
        samples = np.asarray(samples16k, np.float32).ravel()
        if samples.size == 0:
            return
        if at_sample - self._position > MAX_REFERENCE_AHEAD_S * SAMPLE_RATE_HZ:
            raise ValueError(f"reference at sample {at_sample} is too far ahead of {self._position}")
        skip = max(0, self._next - at_sample)
        if skip >= samples.size:
            return
        samples, at_sample = samples[skip:], at_sample + skip
        offset = at_sample - self._ref_start
        end = offset + samples.size
        if end > self._ref.size:
            self._ref = np.concatenate([self._ref, np.zeros(end - self._ref.size, np.float32)])
        self._ref[offset:end] += samples
        self._active = True

    def cut(self, at_sample: int) -> None:
        """Forget reference recorded from ``at_sample`` on (the device will not play it)."""
        keep = max(0, at_sample - self._ref_start)
        self._ref = self._ref[:keep]

    def skip(self, samples: int) -> None:
        """The microphone sent nothing for ``samples`` (a gap in a WebRTC track: Opus DTX, a paused
        track): the clock moves on, and the reference played meanwhile is dropped unheard."""
        if samples <= 0:
            return
        self._carry = np.zeros(0, np.float32)  # a held partial frame does not join audio after a gap
        self._position += samples
        self._next = self._position
        self._trim()  # the reference of the gap, unheard
        if self.tracker is not None:
            self.tracker.gap()
        if self.residual is not None:
            self.residual.reset()

    def process(self, mic16k: AudioArray) -> AudioArray:
        """Microphone audio (16 kHz float32, any length) → the same with the echo removed.

        Returns whole 10 ms frames; the rest is held for the next call. Before any reference has
        been recorded the audio passes through untouched (no filter, no latency from AEC3)."""
        mic = np.asarray(mic16k, np.float32).ravel()
        data = np.concatenate([self._carry, mic]) if self._carry.size else mic
        usable = data.size - data.size % FRAME_SAMPLES
        self._carry = data[usable:].copy()
        start = self._position - (data.size - mic.size)  # stream clock of data[0]
        self._position += mic.size
        if usable == 0:
            return np.zeros(0, np.float32)
        frames = data[:usable]
        self._next = start + usable
        if not self._active:
            self._trim()
            return frames.copy()
        reference = self._read(start, usable)  # as played
        fed = reference
        if self.tracker is not None and not self.passing:
            if self.tracker.push(frames, reference, lambda: self.removed_db(TRACK_REMOVED_MS, 0)):
                self.shifted_at = start + usable
            if self.tracker.shift:
                fed = self._read(start - self.tracker.shift, usable)
        self._trim()
        self._processed_to = start + usable
        loud = np.abs(reference) > REFERENCE_SOUND
        sound = np.flatnonzero(loud)
        if sound.size:
            self._reference_to = start + int(sound[-1]) + 1
        self._track_stretches(np.asarray(loud.reshape(-1, FRAME_SAMPLES).any(axis=1)), start)
        # AEC3 fed silence decays into denormals, 15-20 times slower unless flushed (audio/denormals.py).
        out = np.asarray(call_flushed(self._aec.process, np.ascontiguousarray(frames), fed), np.float32)
        aligned = np.concatenate([self._mic_tail, frames])  # the microphone as late as AEC3's output
        self._mic_tail = aligned[-OUTPUT_LATENCY_SAMPLES:].copy()
        n = out.size // FRAME_SAMPLES
        passed = aligned[: out.size]  # (a view: ``aligned`` is this call's own array)
        if self.detect is not None:
            self.detect.push(_frame_power(reference, n), _frame_power(frames, n))
            if self.detect.echo is False:
                out = passed
        if self.residual is not None:
            self.residual.push(frames, reference, out)
        # Each output frame's energy beside the microphone's for the same audio.
        self._removed.extend(zip(_frame_power(aligned, n), _frame_power(out, n), strict=True))
        return self._hold(out, passed)

    def _hold(self, out: AudioArray, passed: AudioArray) -> AudioArray:
        """``auto`` before it has decided whether the microphone carries the echo: the output waits,
        and goes out once it has (the microphone's own audio where there is none, the canceller's
        where there is), or once it has waited ``hold_undecided_samples`` (the canceller's, as
        ``on``). Put out at once, cancelled and gated, a person speaking over the first seconds of
        an answer on a device that cancels its own echo was held by the gate and taken by AEC3's
        suppressor, and lost (a Realtime trial)."""
        waiting = self.detect is not None and self.detect.echo is None and self.hold_undecided_samples > 0
        if waiting and not self._hold_spent:
            self._held.append((out, passed))
            self._held_samples += out.size
            if self._held_samples < self.hold_undecided_samples:
                return np.zeros(0, np.float32)
            self._hold_spent = True  # undecided this long: put out as it is, from now on at once
            return self.release()
        if not self._held:
            return out
        return np.concatenate([self.release(after=out.size), out])

    def release(self, after: int = 0, *, settle: bool = False) -> AudioArray:
        """The output waiting for ``detect``'s decision (``_hold``), now: the microphone's audio where
        it found no echo, else the canceller's. ``after``: samples processed after it (the frames
        whose energies follow the held ones' in ``_removed``). ``settle``: ``detect`` decides now on
        what it has (``EchoPresence.settle``: a commit, or a sender that stopped sending)."""
        if not self._held:
            return np.zeros(0, np.float32)
        if settle and self.detect is not None:
            self.detect.settle()
        held, self._held, self._held_samples = self._held, [], 0
        self._hold_spent = True  # (once a stream: a commit's release does not start another wait)
        if not self.passing:
            return np.concatenate([out for out, _ in held])
        audio = np.concatenate([passed for _, passed in held])
        # (Put out as it came, nothing removed: measured as a passing microphone's frames are.)
        end = len(self._removed) - after // FRAME_SAMPLES
        for index in range(max(0, end - audio.size // FRAME_SAMPLES), end):
            mic, _ = self._removed[index]
            self._removed[index] = (mic, mic)
        return audio

    def _track_stretches(self, frame_sound: np.ndarray, start: int) -> None:
        """Count the reference's 10 ms frames with sound, and note where each stretch of sound begins."""
        for index, sound in enumerate(frame_sound.tolist()):
            if not sound:
                self._quiet_frames += 1
            else:
                self._sound_frames += 1
                if self._quiet_frames:
                    self._stretches.append((start + index * FRAME_SAMPLES, self._quiet_frames))
                self._quiet_frames = 0
            self._heard_log.append(self._sound_frames)

    def removed_db(self, from_ms_ago: int, to_ms_ago: int) -> float | None:
        """How much the canceller took out of the audio it put out between ``from_ms_ago`` and
        ``to_ms_ago`` ms before its latest output: the median, over the frames with sound in them,
        of the microphone's energy over the output's, in dB. Residual echo leaves mostly removed
        frames (1.7-13.8 dB seen, docs/echo.md); a person, whose speech goes on once the answer
        pauses, mostly kept ones (0.6-1.2 dB). None: no reference was ever recorded, or too few
        frames with sound."""
        if not self._active or from_ms_ago <= to_ms_ago:
            return None
        count = len(self._removed)
        span = islice(self._removed, max(0, count - from_ms_ago // 10), max(0, count - to_ms_ago // 10))
        floor = 10.0 ** (ACTIVE_FRAME_DBFS / 10.0)
        ratios = [mic / out for mic, out in span if out > floor]
        if len(ratios) < MIN_ACTIVE_FRAMES:
            return None
        return float(10.0 * np.log10(max(float(np.median(ratios)), 1e-12)))

    def frame_removed_db(self, samples: int, after: int) -> float | None:
        """How much the canceller took out of ``samples`` of its output that end ``after`` samples
        before the end of its latest (whole 10 ms frames; dB of the microphone's energy over the
        output's); None where it has not measured them (before any reference, or too long ago)."""
        count = len(self._removed)
        end = count - after // FRAME_SAMPLES
        start = end - max(1, samples // FRAME_SAMPLES)
        if start < 0 or end > count:
            return None
        span = list(islice(self._removed, start, end))
        mic, out = sum(m for m, _ in span), sum(o for _, o in span)
        return float(10.0 * np.log10(max(mic, 1e-12) / max(out, 1e-12)))

    def _read(self, start: int, count: int) -> AudioArray:
        """The reference for stream-clock samples ``start`` .. ``start + count`` (zeros where none
        was recorded)."""
        reference = np.zeros(count, np.float32)
        lo = max(start, self._ref_start)
        hi = min(start + count, self._ref_start + self._ref.size)
        if hi > lo:
            reference[lo - start : hi - start] = self._ref[lo - self._ref_start : hi - self._ref_start]
        return reference

    def _trim(self) -> None:
        """Drop the reference before ``_next``, less what the tracker may still shift back to."""
        keep_from = self._next - (self.tracker.max_lag if self.tracker is not None else 0)
        drop = max(0, keep_from - self._ref_start)
        if drop:
            self._ref = self._ref[drop:]
            self._ref_start += drop


class SpeechGate:
    """What the canceller leaves of the echo must not start an utterance (docs/echo.md, the gate).

    While AEC3 converges on a fresh stream (about one answer), and again when the echo's delay moves
    (the next answer's first syllables, now and then), it lets the echo through: single 30 ms frames
    15-30 dB above the output's floor where webrtcvad also calls the floor frames around them voiced,
    or a few frames at -30 to -45 dBFS that it took 9-20 dB out of. The segmenter's trigger (3 voiced
    frames of 5) takes either for speech and barge-in cuts the answer. So the segmenter asks the gate
    about each frame: while echo can be arriving (the reference had sound within ``tail_ms``), a
    frame counts towards a speech start only when it is ``margin_db`` above the output's floor (its
    quietest frame over the last ``FLOOR_S``, no lower than ``FLOOR_MIN_DBFS``) and the canceller took
    less than ``removed_db`` out of it. A person speaking over the answer is loud for several frames
    and mostly kept (a voice as loud as the echo loses 3 dB to the sum; one 6 dB under it, 7 dB);
    what is left of the echo is neither. Where the echo is more than about 6 dB louder than the
    person at the microphone, AEC3's suppressor takes most of them (-40 dBFS and quieter) and what it
    keeps is mostly "removed": they barge in only where the answer is quieter (docs/echo.md). Voice
    heard for long enough was tried as a way round that (300 ms of 450): it let the converging
    canceller's leaks cut the first answer again in 4 of 9 live runs. Outside the echo every frame
    counts, as without a canceller.

    ``converge_s`` above 0 holds the gate only where the leaks are: while the canceller has heard
    less than that much answer audio (``EchoCanceller.reference_heard_s``: it is converging), and
    for ``onset_ms`` into each answer's echo after a quiet stretch (where the delay may have moved).
    Elsewhere a person under a louder echo barges in as without the gate. 0: the whole echo.

    ``restart_ms``: past that, frames within this long of where the device started playing afresh
    (``EchoCanceller.restarted``: an answer's first audio, audio after the device ran out, an
    answer resumed after a pause) are
    noted as suspect too, whatever their level: the echo's delay may have moved there by a frame,
    and AEC3 lets the first syllable through ("Bees") while it finds it again.

    ``hold_s``: over a fresh canceller's first seconds of answer audio nothing in the echo starts an
    utterance. Live, AEC3 took nothing out of the first answer's first words (0-4 dB removed, at
    -17 to -22 dBFS: as loud and as kept as a person) until it had heard 1.5-2.5 s of it; a person
    speaking then starts their utterance once that has passed.

    ``residual_suspect``: a voiced frame in the echo whose canceller output correlates with the
    answer audio at the microphone's delay (``ResidualEcho``, this sharp or more) is noted as the
    canceller's residual: a frame that counts towards a start is then suspect, and each voiced
    frame's note is kept for ``residual_share`` (the word check weighs an utterance that holds the
    paused answer by it: stream/echo_check.py; inside an utterance only while ``notes_utterance``,
    which the session sets while the answer waits on one). Where the echo's delay jumps, AEC3 lets
    the echo through as loud as a person until the delay tracker moves; what it lets through still
    correlates with the answer, and a person speaking does not (tools/echo_stock_phrases.py). A
    voiced frame outside the echo, or where the measure has no reading (the answer quiet over its
    window, or its first 0.9 s after a gap in the microphone), is noted as no residual: a person who
    talks on once the answer paused counts so. The measure reads the latest 0.4 s of the canceller's
    output, so every frame of one large piece of audio (a Realtime client's 0.5 s appends) gets the
    piece's reading.
    """

    FLOOR_S: Final = 2.0
    FLOOR_MIN_DBFS: Final = -60.0

    def __init__(
        self,
        canceller: EchoCanceller,
        margin_db: float,
        tail_ms: float,
        removed_db: float,
        *,
        converge_s: float = 0.0,
        onset_ms: float = 0.0,
        onset_gap_ms: float = ONSET_GAP_MS,
        hold_s: float = 0.0,
        restart_ms: float = 0.0,
        residual: float = 0.0,
        residual_suspect: float = 0.0,
    ) -> None:
        self.canceller = canceller
        self.residual = residual
        self.residual_suspect = residual_suspect
        # Per frame asked about, the latest last: None (not voiced, or not measured), else whether it
        # was the canceller's residual echo (``residual_suspect``).
        self._residual_log: deque[bool | None] = deque(maxlen=RESIDUAL_LOG_FRAMES)
        self._frame_ms = 10.0
        self.notes_utterance = False  # note the voiced frames inside an utterance too (``residual_share``)
        # Something reads the notes and suspect marks (a session that answers with barge-in): else the
        # measure is not run (a Realtime or transcription-only stream never reads them).
        self.read = True
        self.restart_ms = restart_ms
        self.onset_gap_ms = onset_gap_ms
        self.margin_db = margin_db
        self.tail_ms = tail_ms
        self.removed_db = removed_db
        self.converge_s = converge_s
        self.onset_ms = onset_ms
        self.hold_s = hold_s
        self._levels: deque[float] = deque()
        # The last frame asked about passed only because the gate stood aside (``converge_s``): the
        # full rule would have held it (the segmenter's ``SpeechStart.suspect``).
        self.last_suspect = False
        # ... and it came within ``restart_ms`` of the device's playback starting afresh, where the
        # first syllable leaks (the segmenter's ``SpeechStart.restart``).
        self.last_restart = False

    @classmethod
    def of(cls, canceller: EchoCanceller, settings: Settings) -> SpeechGate:
        """The gate with the operator's ``echo_speech_gate_*`` settings."""
        return cls(
            canceller,
            settings.echo_speech_gate_db,
            settings.echo_speech_gate_tail_ms,
            settings.echo_speech_gate_removed_db,
            converge_s=settings.echo_speech_gate_converge_s,
            onset_ms=settings.echo_speech_gate_onset_ms,
            onset_gap_ms=settings.echo_speech_gate_onset_gap_ms,
            hold_s=settings.echo_speech_gate_hold_s,
            restart_ms=settings.echo_speech_gate_restart_ms,
            residual=settings.echo_speech_gate_residual,
            residual_suspect=settings.echo_speech_gate_residual_suspect,
        )

    def __call__(self, frame: AudioArray, after: int = 0, voiced: bool = True, speaking: bool = False) -> bool:
        """Whether this frame (the segmenter's, cut from the canceller's output) may count towards a
        speech start; ``after``: the samples of that output after the frame's end; ``voiced``: the
        VAD heard it, and no utterance is under way (only then is the residual echo measured for the
        start); ``speaking``: the VAD heard it inside an utterance (only noted for ``residual_share``)."""
        self.last_suspect = self.last_restart = False
        level = level_dbfs(frame)
        self._levels.append(level)
        frame_ms = self._frame_ms = max(1.0, frame.size * 1000.0 / SAMPLE_RATE_HZ)
        while len(self._levels) * frame_ms > self.FLOOR_S * 1000.0:
            self._levels.popleft()
        if self.canceller.passing:
            self._residual_log.append(None)
            return True  # auto: this microphone carries no echo
        after_ms = after * 1000.0 / SAMPLE_RATE_HZ
        since = self.canceller.since_reference_ms  # (at the end of the canceller's output, ``after`` past the frame)
        in_echo = since is not None and since - after_ms <= self.tail_ms
        noted = self.residual_suspect > 0 and self.read and (voiced or (speaking and self.notes_utterance))
        residual = noted and in_echo and self._still_echo(self.residual_suspect)
        self._residual_log.append(residual if noted else None)
        if not in_echo:
            return True
        if voiced and self.residual > 0 and self._still_echo(self.residual):
            return False
        heard_s = self.canceller.reference_heard_s_at(after)  # (when the frame was processed)
        if heard_s < self.hold_s:
            return False  # AEC3 has not found the echo yet: it passes it whole, as loud as a person
        onset = self.canceller.since_onset_ms(self.onset_gap_ms) if self.onset_ms > 0 else None
        at_onset = onset is not None and onset - after_ms < self.onset_ms
        if self.converge_s > 0 and heard_s >= self.converge_s and not at_onset:
            # Converged, and not at the first syllables of a sentence or a clause: it counts, but is
            # noted when the rule below would have held it, or when it comes soon after playback
            # started afresh (the delay may have moved: the next answer's first syllable leaks).
            restart = self.canceller.since_restart_ms() if self.restart_ms > 0 else None
            self.last_restart = restart is not None and 0 <= restart - after_ms < self.restart_ms
            self.last_suspect = self.last_restart or residual or not self._like_a_person(frame, level, after)
            return True
        counts = self._like_a_person(frame, level, after)
        self.last_suspect = counts and residual
        return counts

    def residual_share(self, from_ms_ago: float, to_ms_ago: float) -> float | None:
        """The share of the voiced frames between ``from_ms_ago`` and ``to_ms_ago`` before the latest
        frame asked about that were the canceller's residual echo (``residual_suspect``); None: none
        voiced there, or not measured."""
        frames = len(self._residual_log)
        # (Whole frames: a flush's tail shorter than a frame is on the clock, but in no frame.)
        first = max(0, frames - int(from_ms_ago // self._frame_ms))
        last = max(first, frames - int(to_ms_ago // self._frame_ms))
        notes = [n for n in islice(self._residual_log, first, last) if n is not None]
        return sum(notes) / len(notes) if notes else None

    def _still_echo(self, threshold: float) -> bool:
        """The canceller's output over the last moments correlates with the answer audio at the delay
        the microphone does (``ResidualEcho``, ``threshold`` sharp or more): what passed is the echo,
        whatever its level."""
        check = self.canceller.residual
        sharpness = check.sharpness() if check is not None else None
        return sharpness is not None and sharpness >= threshold

    def _like_a_person(self, frame: AudioArray, level: float, after: int) -> bool:
        """The rule over the echo: ``margin_db`` above the output's floor, and less than
        ``removed_db`` taken out by the canceller."""
        floor = max(min(self._levels), self.FLOOR_MIN_DBFS)
        if level < floor + self.margin_db:
            return False
        removed = self.canceller.frame_removed_db(frame.size, after)
        return removed is None or removed < self.removed_db


def _frame_power(samples: AudioArray, frames: int) -> list[float]:
    """The mean square of each of the first ``frames`` 10 ms frames of ``samples``."""
    whole = samples[: frames * FRAME_SAMPLES].reshape(frames, FRAME_SAMPLES)
    power: list[float] = np.mean(np.square(whole, dtype=np.float64), axis=1).tolist()
    return power


def echo_mode(value: object) -> EchoMode | None:
    """A stream's ``echo_cancellation`` option: ``"auto"`` (or null), ``"on"`` / ``"off"`` (or a
    boolean, or ``"true"`` / ``"false"``); None for anything else."""
    if value is True or value in ("on", "true"):
        return "on"
    if value is False or value in ("off", "false"):
        return "off"
    if value is None or value == "auto":
        return "auto"
    return None


def parse_echo_option(value: object) -> EchoMode:
    """``echo_cancellation`` of a device WebSocket or WebRTC ``start``; a bad value is a 400."""
    mode = echo_mode(value)
    if mode is None:
        raise InvalidParameter(
            f"echo_cancellation must be 'auto', 'on', 'off' or a boolean, got {value!r}", param="echo_cancellation"
        )
    return mode
