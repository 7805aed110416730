"""Voice-activity segmentation of a live 16 kHz stream into utterances.

A small state machine over 30 ms webrtcvad frames: idle frames go through a pre-roll ring buffer so
the first syllable (which the VAD only recognises a few frames in) is kept; speech starts when most
of a short window of frames is voiced, and ends after ``hangover_ms`` of continuous silence or at
``max_utterance_s``. Bursts shorter than ``min_speech_ms`` of voiced audio are dropped (clicks,
coughs), after ``burst_hangover_ms`` of silence where that is shorter. The segmenter is
synchronous and cheap; it never calls a model.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import numpy as np
import webrtcvad

from mediaserver.audio.decode import float_to_pcm16
from mediaserver.events import SAMPLE_RATE_HZ, AudioArray

# Over a stream's first ``SegmenterConfig.warmup_ms``, a frame is voiced only above this level (speech
# is louder; webrtcvad, cold, calls a -60 to -30 dBFS noise floor voiced there).
WARMUP_MIN_DBFS: Final = -35.0


def level_dbfs(frame: AudioArray) -> float:
    """A frame's level: its mean power in dB of full scale (-120 for digital silence or no samples)."""
    power = float(np.mean(np.square(frame, dtype=np.float64))) if frame.size else 0.0
    return 10.0 * float(np.log10(power + 1e-12))


@dataclass(frozen=True)
class SegmenterConfig:
    aggressiveness: int = 3
    frame_ms: int = 30
    hangover_ms: int = 500
    preroll_ms: int = 300
    min_speech_ms: int = 200
    # A burst still shorter than ``min_speech_ms`` ends (discarded) after this much silence when it is
    # less than ``hangover_ms``: semantic turns wait up to their cap for an unfinished turn, but a
    # burst too short to keep is no turn (None: ``hangover_ms``).
    burst_hangover_ms: int | None = None
    max_utterance_s: float = 28.0
    trigger_window_frames: int = 5
    trigger_voiced_frames: int = 3
    # webrtcvad starts cold: it calls the first 90-120 ms of any stream voiced, a -60 dBFS noise floor
    # included, which started (and discarded) an utterance at 0 ms on every stream. Over a stream's
    # first ``warmup_ms`` a frame counts as voiced only when louder than ``WARMUP_MIN_DBFS``.
    warmup_ms: int = 120


@dataclass(frozen=True)
class SpeechStart:
    start_ms: int
    # Most of the frames that started it are ones the gate (``SpeechGate``) let through only because
    # it stood aside (the canceller converged): quiet against the output's floor, or mostly removed by
    # the canceller, as its leaks are (stream/echo_check.py: such a start pauses the answer).
    suspect: bool = False
    # ... and most of those frames came just after the device's playback started afresh (an answer's
    # first audio, a sentence after the device ran dry, an answer resumed): ``SpeechGate.last_restart``.
    restart: bool = False


@dataclass(frozen=True)
class Utterance:
    audio: AudioArray
    start_ms: int
    end_ms: int
    reason: str  # "silence", "turn" (end_turn: the turn model decided), "max_length" or "flush"
    silence_ms: int = 0  # the continuous silence it ends with (part of ``audio``)


@dataclass(frozen=True)
class Discarded:
    start_ms: int
    end_ms: int


SegmentEvent = SpeechStart | Utterance | Discarded


class VadSegmenter:
    def __init__(self, config: SegmenterConfig | None = None) -> None:
        self.config = config or SegmenterConfig()
        self._frames_seen = 0  # frames this segmenter has judged (its VAD's warm-up: SegmenterConfig.warmup_ms)
        self._vad = webrtcvad.Vad(self.config.aggressiveness)
        self._frame_samples = SAMPLE_RATE_HZ * self.config.frame_ms // 1000
        self._pending = np.zeros(0, np.float32)
        self._preroll: collections.deque[AudioArray] = collections.deque(
            maxlen=max(1, self.config.preroll_ms // self.config.frame_ms)
        )
        self._recent: collections.deque[bool] = collections.deque(maxlen=self.config.trigger_window_frames)
        self._suspect: collections.deque[bool] = collections.deque(maxlen=self.config.trigger_window_frames)
        self._restart: collections.deque[bool] = collections.deque(maxlen=self.config.trigger_window_frames)
        self._frames: list[AudioArray] = []
        self._in_speech = False
        self._silence_ms = 0
        self._voiced_ms = 0
        self._start_ms = 0
        self._position_ms = 0  # stream time at the end of the last processed frame
        # Audio counted but not framed (skipped, a flushed tail), not yet a whole ms on the clock.
        self._skipped_samples = 0
        # Asked about each frame, with how many samples were pushed after it: may it count towards a
        # speech start? (audio/echo.py SpeechGate: not what the echo canceller leaks.) None: every
        # voiced frame does.
        self.gate: Callable[[AudioArray, int, bool, bool], bool] | None = None

    @property
    def in_speech(self) -> bool:
        return self._in_speech

    @property
    def silence_ms(self) -> int:
        """Continuous silence at the end of the utterance in progress (0 when idle or voiced)."""
        return self._silence_ms if self._in_speech else 0

    @property
    def position_ms(self) -> int:
        return self._position_ms

    @property
    def long_enough(self) -> bool:
        """Whether the utterance in progress has enough voiced audio (``min_speech_ms``) to be kept if
        it ended now; a shorter burst would be discarded."""
        return self._in_speech and self._voiced_ms >= self.config.min_speech_ms

    def current_audio(self) -> AudioArray:
        """The utterance so far (for partial transcripts); empty when idle."""
        return np.concatenate(self._frames) if self._frames else np.zeros(0, np.float32)

    def current_samples(self) -> int:
        """How long ``current_audio`` is."""
        return sum(frame.size for frame in self._frames)

    def push(self, samples: AudioArray) -> list[SegmentEvent]:
        events: list[SegmentEvent] = []
        data = (
            np.concatenate([self._pending, samples.astype(np.float32, copy=False)]) if self._pending.size else samples
        )
        n = self._frame_samples
        whole = data.size - data.size % n
        for offset in range(0, whole, n):
            event = self._frame(np.asarray(data[offset : offset + n], dtype=np.float32), data.size - offset - n)
            if event is not None:
                events.append(event)
        self._pending = np.array(data[whole:], dtype=np.float32)
        return events

    def flush(self) -> Utterance | Discarded | None:
        """End the current utterance now (end of stream, or the client committed)."""
        if not self._in_speech:
            return None
        return self._finish("flush")

    def end_turn(self) -> Utterance | Discarded | None:
        """End the utterance now, in a pause shorter than the hangover (the turn model found the
        turn finished); the audio not yet framed stays for the next utterance."""
        if not self._in_speech:
            return None
        return self._finish("turn")

    def skip(self, samples: int) -> None:
        """Audio that went elsewhere (a wake-word gate held it back) still counts on the stream
        clock, so times stay comparable with the connection's audio; only between utterances."""
        if self._in_speech or samples <= 0:
            return
        self.reset()
        self._count(samples)

    def _count(self, samples: int) -> None:
        """Move the stream clock on by audio not framed here (its fraction of a ms is kept for later)."""
        self._skipped_samples += samples
        whole_ms = self._skipped_samples * 1000 // SAMPLE_RATE_HZ
        self._position_ms += whole_ms
        self._skipped_samples -= whole_ms * SAMPLE_RATE_HZ // 1000

    def reset(self) -> None:
        """Drop everything buffered; the stream clock still counts the dropped audio."""
        self._count(self._pending.size)
        self._frames = []
        self._in_speech = False
        self._preroll.clear()
        self._recent.clear()
        self._suspect.clear()
        self._restart.clear()
        self._pending = np.zeros(0, np.float32)

    def _frame(self, frame: AudioArray, after: int = 0) -> SegmentEvent | None:
        cfg = self.config
        voiced = bool(self._vad.is_speech(float_to_pcm16(frame), SAMPLE_RATE_HZ))
        if voiced and self._frames_seen * cfg.frame_ms < cfg.warmup_ms:
            voiced = level_dbfs(frame) > WARMUP_MIN_DBFS  # (webrtcvad's cold start: see SegmenterConfig)
        self._frames_seen += 1
        self._position_ms += cfg.frame_ms
        # (The gate sees every frame; it measures more where the frame would count towards a start,
        # and notes the voiced frames of an utterance for the word check: audio/echo.py SpeechGate.)
        starts = True
        if self.gate is not None:
            starts = self.gate(frame, after, voiced and not self._in_speech, voiced and self._in_speech)
        if not self._in_speech:
            self._preroll.append(frame)
            self._recent.append(voiced and starts)
            self._suspect.append(voiced and starts and bool(getattr(self.gate, "last_suspect", False)))
            self._restart.append(voiced and starts and bool(getattr(self.gate, "last_restart", False)))
            if sum(self._recent) >= cfg.trigger_voiced_frames:
                suspect = 2 * sum(self._suspect) > sum(self._recent)
                restart = suspect and 2 * sum(self._restart) > sum(self._recent)
                self._in_speech = True
                self._frames = list(self._preroll)
                self._preroll.clear()
                self._recent.clear()
                self._suspect.clear()
                self._restart.clear()
                self._silence_ms = 0
                self._voiced_ms = cfg.trigger_voiced_frames * cfg.frame_ms
                self._start_ms = max(0, self._position_ms - len(self._frames) * cfg.frame_ms)
                return SpeechStart(self._start_ms, suspect, restart)
            return None
        self._frames.append(frame)
        if voiced:
            self._silence_ms = 0
            self._voiced_ms += cfg.frame_ms
        else:
            self._silence_ms += cfg.frame_ms
        hangover_ms = cfg.hangover_ms
        if cfg.burst_hangover_ms is not None and self._voiced_ms < cfg.min_speech_ms:
            hangover_ms = min(hangover_ms, cfg.burst_hangover_ms)
        if self._silence_ms >= hangover_ms:
            return self._finish("silence")
        if len(self._frames) * cfg.frame_ms >= cfg.max_utterance_s * 1000:
            return self._finish("max_length")
        return None

    def _finish(self, reason: str) -> Utterance | Discarded:
        audio = np.concatenate(self._frames) if self._frames else np.zeros(0, np.float32)
        if self._pending.size and reason == "flush":
            # The tail shorter than a frame is the utterance's too, and counts on the stream clock
            # (docs/ws-protocol.md: times count the audio received).
            audio = np.concatenate([audio, self._pending])
            self._count(self._pending.size)
            self._pending = np.zeros(0, np.float32)
        start_ms, end_ms = self._start_ms, self._position_ms
        voiced_ms, silence_ms = self._voiced_ms, self._silence_ms
        self._frames = []
        self._in_speech = False
        self._silence_ms = 0
        self._voiced_ms = 0
        if voiced_ms < self.config.min_speech_ms:
            return Discarded(start_ms, end_ms)
        return Utterance(audio, start_ms, end_ms, reason, silence_ms)
