"""The Whisper engine: CTranslate2 through faster-whisper, called from one worker thread.

The interface takes a batch so the scheduler can hand it every job that is ready at once; jobs in
a batch fail independently (one bad job returns its exception, the others their transcripts).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from mediaserver.audio.vad import VadConfig, has_speech
from mediaserver.events import (
    SAMPLE_RATE_HZ,
    AudioArray,
    Segment,
    Transcript,
    TranscriptionOptions,
    Word,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AsrJob:
    audio: AudioArray
    options: TranscriptionOptions


class WhisperEngine:
    """One loaded CTranslate2 Whisper model; not thread-safe, used from a single worker thread."""

    def __init__(
        self,
        name: str,
        model_dir: str,
        *,
        device: str = "cpu",
        compute_type: str = "int8",
        cpu_threads: int = 0,
        device_index: Sequence[int] = (0,),
        vad: VadConfig | None = None,
        neural_vad_filter: bool = True,
    ) -> None:
        from faster_whisper import WhisperModel

        self.name = name
        self.model_dir = model_dir
        self._vad = vad or VadConfig()
        self._neural_vad_filter = neural_vad_filter
        started = time.perf_counter()
        self.model = WhisperModel(
            model_dir,
            device=device,
            device_index=list(device_index),
            compute_type=compute_type,
            cpu_threads=cpu_threads,
            num_workers=1,
        )
        self.multilingual: bool = bool(self.model.model.is_multilingual)
        log.info(
            "loaded model %s from %s on %s/%s in %.2f s (multilingual=%s)",
            name,
            model_dir,
            device,
            compute_type,
            time.perf_counter() - started,
            self.multilingual,
        )

    def transcribe_batch(self, jobs: Sequence[AsrJob]) -> list[Transcript | BaseException]:
        results: list[Transcript | BaseException] = []
        for job in jobs:
            try:
                results.append(self.transcribe_one(job))
            except Exception as exc:  # a failing job fails alone
                log.exception("ASR job failed on model %s", self.name)
                results.append(exc)
        return results

    def transcribe_one(self, job: AsrJob) -> Transcript:
        options = job.options
        audio = job.audio
        duration_s = audio.size / SAMPLE_RATE_HZ
        started = time.perf_counter()
        language = options.language if self.multilingual else "en"
        if not has_speech(audio, self._vad):
            return Transcript(
                text="",
                language=language or "en",
                language_probability=0.0,
                duration_s=duration_s,
                infer_time_s=time.perf_counter() - started,
                model=self.name,
                task=options.task,
                speech_detected=False,
            )
        segments_iter, info = self.model.transcribe(
            np.ascontiguousarray(audio, dtype=np.float32),
            language=language,
            task=options.task if self.multilingual else "transcribe",
            beam_size=options.beam_size,
            best_of=max(options.beam_size, 1),
            temperature=list(options.temperature),
            initial_prompt=options.initial_prompt,
            word_timestamps=options.word_timestamps,
            without_timestamps=not options.with_segment_timestamps,
            condition_on_previous_text=False,
            vad_filter=self._neural_vad_filter,
        )
        segments: list[Segment] = []
        for seg in segments_iter:
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
