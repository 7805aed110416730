"""What goes through an ASR engine: a job (``AsrJob``), and what one batch call of the Whisper
engine has found so far (``BatchRun``). They sit below ``engine`` and ``engine_guards`` (the
engine's guards read both), so that neither imports the other."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from mediaserver.asr.guards import GuardReason
from mediaserver.asr.windows import WINDOW_S, JobResult, Span
from mediaserver.events import AudioArray, Transcript, TranscriptionOptions


@dataclass(frozen=True)
class AsrJob:
    audio: AudioArray
    options: TranscriptionOptions
    # The shortest encoder window this job may use, in seconds (Whisper's own is 30 s): tiny.en
    # encodes a 10 s window about 4x faster than a 30 s one, with the same WER on short utterances
    # (``asr_window_s``, ``asr_partial_window_s``; tools/README.md). See ``encoder_window_s``.
    min_window_s: float = WINDOW_S
    # What a decode that trips a loop or hallucination guard (``asr/guards.py``) becomes: decoded
    # again the safe way (finals, uploads), or returned as it is with ``Transcript.guard`` set, for
    # the caller to drop (a partial: the next one comes in a few hundred milliseconds).
    on_guard: Literal["redecode", "keep"] = "redecode"
    # Silence decoded before speech that starts at once (within the first half of this: a file
    # whose first word begins at once; ``asr_lead_silence_ms``); 0 for a stream's utterance under
    # server VAD, which starts at its VAD's preroll.
    lead_s: float = 0.0
    # Set once nobody waits for the transcript any more (the caller hung up, the server is stopping:
    # the scheduler sets it): the engine stops decoding the job at its next window or segment.
    abandoned: threading.Event | None = field(default=None, compare=False, repr=False)


class JobAbandoned(Exception):
    """Nobody waits for this job's transcript any more: its decode was stopped (the engine keeps it
    to that job: the other jobs of its batch go on)."""


def gone(job: AsrJob) -> bool:
    """Whether ``job``'s caller has gone (``AsrJob.abandoned``)."""
    return job.abandoned is not None and job.abandoned.is_set()


@dataclass
class BatchRun:
    """What one ``transcribe_batch`` call has found so far, shared by its decode rounds.

    ``results`` holds a finished job's transcript or exception; ``states`` the segments of the jobs
    on the batched path; ``sequential`` the jobs that fell back to faster-whisper's own loop.
    """

    jobs: Sequence[AsrJob]
    results: list[Transcript | BaseException | None]
    states: dict[int, JobResult] = field(default_factory=dict)
    sequential: list[int] = field(default_factory=list)
    # Seconds of speech the neural VAD found in each job's audio (the guards' speaking rate).
    voiced_s: dict[int, float] = field(default_factory=dict)
    # Where that speech is, in samples of the job's audio (a window's own speaking rate).
    speech: dict[int, list[Span]] = field(default_factory=dict)
    # The guard a job's short-window decode tripped, for which it was decoded again on 30 s.
    guarded: dict[int, GuardReason] = field(default_factory=dict)

    def fall_back(self, job_index: int) -> None:
        if job_index not in self.sequential:
            self.sequential.append(job_index)
