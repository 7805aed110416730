"""Windows for CTranslate2 Whisper's batched path: a job's audio cut at pauses into windows of at
most 30 s, short jobs packed several to a window (``pack_windows``), and a packed window's decoded
segments handed back to its members by time (``assign_segments``). What one window decodes to is a
``WindowOutput``; ``batching.BatchDecoder`` runs the windows.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mediaserver.events import SAMPLE_RATE_HZ, AudioArray, TranscriptionOptions

WINDOW_S = 30.0
WINDOW_SAMPLES = int(WINDOW_S * SAMPLE_RATE_HZ)
# Audio longer than this is decoded with timestamps even when none are asked for: they show where
# Whisper stopped, so nothing in a long window is dropped.
TIMESTAMPS_PAST_S = 20.0
COMPRESSION_RATIO_THRESHOLD = 2.4
LOG_PROB_THRESHOLD = -1.0
NO_SPEECH_THRESHOLD = 0.6


@dataclass(frozen=True)
class Span:
    """A stretch of a job's audio, in samples of the job's own timeline."""

    start: int
    end: int


@dataclass
class Member:
    """One job's audio inside a window: where it sits in the window and in the job's timeline."""

    job_index: int
    window_start_s: float
    window_end_s: float
    job_offset_s: float


@dataclass
class Window:
    audio: AudioArray
    members: list[Member]
    options: TranscriptionOptions
    with_timestamps: bool
    language: str | None = None
    # Seconds of mel frames the encoder sees: Whisper's 30 s, or a shorter window for a partial.
    encoder_s: float = WINDOW_S
    # A tail's: the text just before its audio, its prompt; words repeating it are dropped (asr/tails.py).
    follows: str = ""
    # Silence the decoder puts before the audio, whose timestamps leave it out: a window that starts
    # where its speech does (a file whose first word begins at once) gets some, or Whisper drops that
    # word ("Turn on the kitchen lights." heard as "on the kitchen lights.").
    lead_s: float = 0.0

    @property
    def packed(self) -> bool:
        return len(self.members) > 1

    @property
    def duration_s(self) -> float:
        return self.audio.size / SAMPLE_RATE_HZ


@dataclass
class WindowOutput:
    segments: list[dict[str, Any]]
    language: str
    language_probability: float
    avg_logprob: float
    no_speech_prob: float
    compression_ratio: float
    temperature: float
    # Window time up to which the text is final. Whisper drops a segment it could not finish
    # (usually the last one in a full window); the audio after this point must be decoded again.
    complete_until_s: float = float("inf")
    # The decode stopped at its token cap, not at end-of-text (a short window's run-on decode).
    capped: bool = False

    @property
    def text(self) -> str:
        """The window's text as decoded (its segments' texts joined)."""
        return "".join(str(seg["text"]) for seg in self.segments)

    @property
    def is_silence(self) -> bool:
        return self.no_speech_prob > NO_SPEECH_THRESHOLD and self.avg_logprob < LOG_PROB_THRESHOLD

    @property
    def needs_fallback(self) -> bool:
        if self.is_silence:
            return False
        return self.compression_ratio > COMPRESSION_RATIO_THRESHOLD or self.low_confidence

    @property
    def low_confidence(self) -> bool:
        """Whisper's log-probability fallback test alone. A packed window is judged by this plus the
        compression ratio of each member's own text: two devices saying the same command in one
        window is repetition across jobs, not a decoding loop."""
        return not self.is_silence and self.avg_logprob < LOG_PROB_THRESHOLD


@dataclass
class JobResult:
    """What the windows of one job produced so far: segments in job time, with their window's scores."""

    language: str = "en"
    language_probability: float = 0.0
    raw: list[tuple[dict[str, Any], WindowOutput]] = field(default_factory=list)
    windows_seen: int = 0


@dataclass(frozen=True)
class PackingConfig:
    """When short jobs may share a window (see ``PackingPolicy``).

    ``min_waiting``: pack only when at least this many jobs wait (this batch and the queue behind
    it); ``min_saving_s``: and only when encoding each of them in a window of its own would take
    longer than this. ``min_waiting=2, min_saving_s=0`` packs whenever two jobs meet.
    """

    enabled: bool = False
    gap_s: float = 1.0
    max_job_s: float = 10.0
    max_window_s: float = 24.0
    min_waiting: int = 2
    min_saving_s: float = 0.0


class PackingPolicy:
    """Decides, batch by batch, whether short jobs may share a 30 s window.

    Packing is where most CPU throughput comes from, but it changes some transcripts: Whisper hears
    the neighbouring utterances (in the encoder, instead of silence padding) and reads their text
    (in the decoder) as context, so a sentence that decodes right alone can come back different
    ("like in Paris" heard as "lichen pairs"). So a job is decoded alone whenever the engine keeps
    up, and packed only under a backlog: when more jobs wait than one batch takes (``min_waiting``,
    by default one more than the scheduler's batch), and when the encoder time packing saves is
    worth it (``min_saving_s``: the waiting jobs, each encoded in its own window, at the measured
    encoder cost per window; on a GPU that is small and nothing is packed). Both are counts and
    measurements of the engine's own work, not of wall time, so the decision does not swing with
    other load on the machine. Until the encoder has been timed once, the saving is assumed.
    """

    def __init__(self, config: PackingConfig) -> None:
        self.config = config
        self.encode_s_per_window: float | None = None

    def should_pack(self, waiting_jobs: int) -> bool:
        if not self.config.enabled or waiting_jobs < max(2, self.config.min_waiting):
            return False
        if self.encode_s_per_window is None or self.config.min_saving_s <= 0:
            return True
        return waiting_jobs * self.encode_s_per_window > self.config.min_saving_s

    def observe_encoder(self, windows: int, elapsed_s: float) -> None:
        """Record the time of one encoder pass over ``windows`` windows (a moving average)."""
        if windows <= 0:
            return
        cost = elapsed_s / windows
        current = self.encode_s_per_window
        self.encode_s_per_window = cost if current is None else 0.7 * current + 0.3 * cost


# Audio a short encoder window leaves silent after the speech: Whisper, trained on 30 s windows,
# runs on (repeats itself) when speech reaches the end of a short one.
SHORT_WINDOW_MARGIN_S = 2.0
# Tokens a short window may generate per second of audio (speech is 2-5 tokens a second), beyond
# a fixed allowance: the cap that stops a run-on decode early.
SHORT_WINDOW_TOKENS_PER_S = 8.0
SHORT_WINDOW_EXTRA_TOKENS = 12


def encoder_window_s(samples: int, min_window_s: float) -> float:
    """The encoder window for audio of ``samples`` that may use windows from ``min_window_s`` up.

    The window doubles from ``min_window_s`` until the audio fits with ``SHORT_WINDOW_MARGIN_S``
    of silence after it, and is Whisper's 30 s past that; few sizes, so several sessions'
    partials share one encoder call.
    """
    if min_window_s >= WINDOW_S:
        return WINDOW_S
    window = max(min_window_s, 1.0)
    while window < WINDOW_S and samples / SAMPLE_RATE_HZ > window - SHORT_WINDOW_MARGIN_S:
        window *= 2
    return min(window, WINDOW_S)


def split_into_windows(spans: Sequence[Span], total_samples: int, pad_samples: int) -> list[Span]:
    """Group speech spans into <= 30 s windows, cutting only in the pauses between spans.

    Each span is widened by ``pad_samples`` on both sides (clamped to the audio) so first and last
    syllables are not clipped; where two widened spans overlap, the cut goes in the middle of their
    pause. A single span longer than 30 s is cut hard.
    """
    windows: list[Span] = []
    current: Span | None = None
    for raw in spans:
        span = Span(max(0, raw.start - pad_samples), min(total_samples, raw.end + pad_samples))
        if span.end - span.start > WINDOW_SAMPLES:
            if current is not None:
                windows.append(current)
                current = None
            windows += [Span(c, min(span.end, c + WINDOW_SAMPLES)) for c in range(span.start, span.end, WINDOW_SAMPLES)]
            continue
        if current is None:
            current = span
        elif span.end - current.start <= WINDOW_SAMPLES:
            current = Span(current.start, max(current.end, span.end))
        elif span.start < current.end:
            cut = (span.start + current.end) // 2
            windows.append(Span(current.start, cut))
            current = Span(cut, span.end)
        else:
            windows.append(current)
            current = span
    if current is not None:
        windows.append(current)
    return [w for w in windows if w.end > w.start]


def pack_windows(
    singles: Sequence[Window],
    *,
    gap_s: float,
    max_window_s: float = WINDOW_S - 1.0,
    by_duration: bool = True,
) -> list[Window]:
    """Pack single-member windows that share decode settings into shared 30 s windows.

    Members are separated by ``gap_s`` of silence, which Whisper reliably ends a segment on, so the
    timestamps it emits tell which text belongs to which job. Packed audio stops at ``max_window_s``:
    Whisper tends to leave speech near the end of a 30 s window as an unfinished segment. Members
    are taken shortest first (``by_duration``), or in the order given.
    """
    gap = np.zeros(int(gap_s * SAMPLE_RATE_HZ), np.float32)
    packed: list[Window] = []
    by_key: dict[tuple[Any, ...], list[Window]] = defaultdict(list)
    for window in singles:
        if window.options.prefix:  # a forced prefix belongs to one job's audio: never share its window
            packed.append(window)
            continue
        key = (window.options.language, window.options.task, window.options.beam_size, window.options.initial_prompt)
        by_key[key].append(window)
    for group in by_key.values():
        current: list[Window] = []
        length_s = 0.0
        for window in sorted(group, key=lambda w: w.duration_s) if by_duration else group:
            extra = window.duration_s + (gap_s if current else 0.0)
            if current and length_s + extra > max_window_s:
                packed.append(_join(current, gap))
                current, length_s = [], 0.0
                extra = window.duration_s
            current.append(window)
            length_s += extra
        if current:
            packed.append(_join(current, gap))
    return packed


def _join(windows: list[Window], gap: AudioArray) -> Window:
    if len(windows) == 1:
        return windows[0]
    parts: list[AudioArray] = []
    members: list[Member] = []
    position_s = 0.0
    for index, window in enumerate(windows):
        if index:
            parts.append(gap)
            position_s += gap.size / SAMPLE_RATE_HZ
        parts.append(window.audio)
        member = window.members[0]
        members.append(Member(member.job_index, position_s, position_s + window.duration_s, member.job_offset_s))
        position_s += window.duration_s
    first = windows[0]
    audio = np.concatenate(parts)
    return Window(audio, members, first.options, with_timestamps=True, language=first.language, lead_s=first.lead_s)


def text_loops(segments: Sequence[dict[str, Any]]) -> bool:
    """Whisper's compression-ratio test (a repetition loop) on one job's text."""
    from faster_whisper.transcribe import get_compression_ratio

    text = "".join(str(seg["text"]) for seg in segments).strip()
    return bool(text) and get_compression_ratio(text) > COMPRESSION_RATIO_THRESHOLD


def window_member(window: Window, job_index: int) -> Member:
    return next(m for m in window.members if m.job_index == job_index)


@dataclass
class Assignment:
    """A packed window's text split back per job.

    ``segments`` holds, in job time, the text of every member whose speech was told apart from its
    neighbours'; ``unsure`` the members whose text ran into a neighbour's (a segment straddling two
    jobs, or text Whisper placed in the silent gap between them). Only those need decoding again.
    """

    segments: dict[int, list[dict[str, Any]]]
    unsure: set[int]


def assign_segments(window: Window, output: WindowOutput) -> Assignment:
    """Split a packed window's segments back to its members by time."""
    assigned: dict[int, list[dict[str, Any]]] = {m.job_index: [] for m in window.members}
    unsure: set[int] = set()
    tolerance_s = 0.25
    for seg in output.segments:
        owners = [
            m
            for m in window.members
            if seg["start"] < m.window_end_s + tolerance_s and seg["end"] > m.window_start_s - tolerance_s
        ]
        overlapping = [
            m for m in owners if min(seg["end"], m.window_end_s) - max(seg["start"], m.window_start_s) > tolerance_s
        ]
        if len(overlapping) > 1:
            unsure.update(m.job_index for m in overlapping)
            continue
        if not owners:
            if seg["text"].strip():  # text in a gap: it belongs to a neighbour, but which one?
                before = [m for m in window.members if m.window_end_s <= seg["start"]]
                after = [m for m in window.members if m.window_start_s >= seg["end"]]
                neighbours = [*before[-1:], *after[:1]] or window.members
                unsure.update(m.job_index for m in neighbours)
            continue
        owner = overlapping[0] if overlapping else owners[0]
        shifted = dict(seg)
        shifted["start"] = max(0.0, seg["start"] - owner.window_start_s) + owner.job_offset_s
        shifted["end"] = max(0.0, min(seg["end"], owner.window_end_s) - owner.window_start_s) + owner.job_offset_s
        assigned[owner.job_index].append(shifted)
    for job_index in unsure:
        del assigned[job_index]
    return Assignment(assigned, unsure)
