"""The Whisper engine's sequential path: faster-whisper's own loop over one job (word timestamps,
the temperature fallback of a guard's redecode, a window decoded alone, a job the batched path
cannot take).

``SequentialDecodes`` is that part of ``WhisperEngine`` (engine.py), as ``GuardedDecodes``
(engine_guards.py) is its guards'; what it reads of the engine is declared here. A job whose
caller has gone (``AsrJob.abandoned``) stops between the windows faster-whisper decodes.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from mediaserver.asr.jobs import AsrJob, JobAbandoned, gone
from mediaserver.asr.windows import TIMESTAMPS_PAST_S
from mediaserver.audio.vad import VadConfig, has_speech
from mediaserver.events import SAMPLE_RATE_HZ, Segment, Transcript, Word


class SequentialDecodes:
    """The sequential half of ``WhisperEngine``."""

    name: str
    model: Any  # faster_whisper.WhisperModel
    multilingual: bool
    _neural_vad_filter: bool
    _vad: VadConfig

    def _empty(self, job: AsrJob, started: float) -> Transcript:
        raise NotImplementedError

    def transcribe_one(self, job: AsrJob) -> Transcript:
        options = job.options
        audio = job.audio
        duration_s = audio.size / SAMPLE_RATE_HZ
        started = time.perf_counter()
        language = options.language if self.multilingual else "en"
        if not has_speech(audio, self._vad):
            return self._empty(job, started)
        segments_iter, info = self.model.transcribe(
            np.ascontiguousarray(audio, dtype=np.float32),
            language=language,
            task=options.task if self.multilingual else "transcribe",
            beam_size=options.beam_size,
            best_of=max(options.beam_size, 1),
            temperature=list(options.temperature),
            initial_prompt=options.initial_prompt,
            prefix=options.prefix,
            word_timestamps=options.word_timestamps,
            # Past one short window, only timestamps tell where Whisper stopped in each 30 s window;
            # without them it skips to the next window and loses what it left (as the batched path).
            # Word timestamps need them too: without, faster-whisper seeks to the last word's end and
            # decodes the silence after it again ("... lights, please. Please.").
            without_timestamps=not (options.with_segment_timestamps or options.word_timestamps)
            and duration_s <= TIMESTAMPS_PAST_S,
            condition_on_previous_text=False,
            vad_filter=self._neural_vad_filter,
        )
        segments: list[Segment] = []
        for seg in segments_iter:  # (faster-whisper decodes each 30 s window as it is asked for the next)
            if gone(job):
                raise JobAbandoned()
            words = tuple(Word(float(w.start), float(w.end), w.word, float(w.probability)) for w in (seg.words or ()))
            segments.append(
                Segment(
                    id=len(segments),
                    seek=int(seg.seek),
                    start_s=float(seg.start),
                    end_s=float(seg.end),
                    text=seg.text,
                    tokens=tuple(int(t) for t in seg.tokens),
                    temperature=float(seg.temperature or 0.0),
                    avg_logprob=float(seg.avg_logprob),
                    compression_ratio=float(seg.compression_ratio),
                    no_speech_prob=float(seg.no_speech_prob),
                    words=words,
                )
            )
        text = "".join(s.text for s in segments).strip()
        return Transcript(
            text=text,
            language=info.language,
            language_probability=float(info.language_probability),
            duration_s=duration_s,
            segments=tuple(segments),
            infer_time_s=time.perf_counter() - started,
            model=self.name,
            task=options.task,
            speech_detected=bool(segments),
        )
