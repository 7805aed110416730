"""The loop and hallucination guards of the Whisper engine (``asr/guards.py`` judges a text; this
decides what a decode that trips one becomes).

``GuardedDecodes`` is the part of ``WhisperEngine`` (engine.py) that judges its decodes: a finished
transcript, window by window when it spans several (a decoder loop happens inside one window; a
person saying the same sentence for minutes is not one), a full window that fails only Whisper's
compression-ratio test (real repetition compresses like a loop), and a short window's text (a loop
that test cannot see on a short text). A transcript that trips a guard is decoded again the safe
way (``redecode_safely``) or, for partials, kept and marked.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace

from mediaserver.asr.guards import GuardConfig, GuardReason, check_text, normalized_words, repeated_phrase
from mediaserver.asr.jobs import AsrJob, BatchRun, gone
from mediaserver.asr.window_groups import WindowGroup, shift_segments, window_groups
from mediaserver.asr.windows import NO_SPEECH_THRESHOLD, WINDOW_S, Span, Window, WindowOutput
from mediaserver.audio.vad import VadConfig
from mediaserver.events import DEFAULT_TEMPERATURES, SAMPLE_RATE_HZ, AudioArray, Segment, Transcript

log = logging.getLogger("mediaserver.asr.engine")


class GuardedDecodes:
    """The guards' half of ``WhisperEngine``: what it reads of the engine is declared here."""

    name: str
    guards: GuardConfig
    counters: dict[str, int]
    _neural_vad_filter: bool
    _vad: VadConfig

    def _speech_spans(self, audio: AudioArray) -> list[Span]:
        raise NotImplementedError

    def _empty(self, job: AsrJob, started: float) -> Transcript:
        raise NotImplementedError

    def transcribe_one(self, job: AsrJob) -> Transcript:
        raise NotImplementedError

    def _guarded(
        self, job: AsrJob, transcript: Transcript, voiced_s: float | None, speech: list[Span] | None = None
    ) -> Transcript:
        """The transcript, or, when it trips a loop or hallucination guard, its safe redecode
        (``on_guard="redecode"``) or itself marked with the guard (``"keep"``).

        A decoder loop happens inside one decoder pass (one window of <= 30 s), so a transcript of
        several windows is judged window by window, each against the speech in its own stretch of
        audio, and only a window that trips is decoded again: a person who says the same sentence
        over minutes is not a loop, and the windows that passed are kept as they are.
        """
        groups = window_groups(transcript.segments, job.audio.size / SAMPLE_RATE_HZ)
        if len(groups) > 1:
            return self._guarded_by_window(job, transcript, groups, speech)
        if voiced_s is None:
            voiced_s = self.voiced_seconds(job.audio)
        reason = check_text(transcript.text, voiced_s, self.guards)
        if reason is None:
            return transcript
        self.counters[f"guard_{job.on_guard}_{reason}"] += 1
        if job.on_guard == "keep":
            return replace(transcript, guard=reason)
        log.info(
            "model %s: a decode of %.2f s (%.2f s voiced, %d words) tripped the %s guard; decoding it again safely",
            self.name,
            job.audio.size / SAMPLE_RATE_HZ,
            voiced_s,
            len(transcript.text.split()),
            reason,
        )
        return self.redecode_safely(job, transcript, reason, voiced_s)

    def _guarded_by_window(
        self, job: AsrJob, transcript: Transcript, groups: list[WindowGroup], speech: list[Span] | None
    ) -> Transcript:
        """``_guarded`` for a transcript of several windows: each judged and redecoded on its own."""
        if speech is None and self._neural_vad_filter:
            speech = self._speech_spans(job.audio)
        judged: list[tuple[WindowGroup, float, GuardReason | None]] = []
        for group in groups:
            voiced_s = self._voiced_between(job.audio, speech, group.start_s, group.end_s)
            judged.append((group, voiced_s, check_text(group.text, voiced_s, self.guards)))
        reasons = [reason for _, _, reason in judged if reason is not None]
        if not reasons:
            return transcript
        for tripped in reasons:
            self.counters[f"guard_{job.on_guard}_{tripped}"] += 1
        if job.on_guard == "keep":
            return replace(transcript, guard=reasons[0])
        segments: list[Segment] = []
        extra_time_s = 0.0
        for group, voiced_s, reason in judged:
            if reason is None or gone(job):  # (nobody waits for a redecode of a job abandoned)
                segments.extend(group.segments)
                continue
            log.info(
                "model %s: the window at %.2f-%.2f s of a decode (%.2f s voiced, %d words) tripped the %s guard; "
                "decoding it again safely",
                self.name,
                group.start_s,
                group.end_s,
                voiced_s,
                len(group.text.split()),
                reason,
            )
            first_sample, end_sample = round(group.start_s * SAMPLE_RATE_HZ), round(group.end_s * SAMPLE_RATE_HZ)
            part = replace(job, audio=job.audio[first_sample:end_sample])
            first = replace(
                transcript, text=group.text.strip(), segments=group.shifted(-group.start_s), infer_time_s=0.0
            )
            safe = self.redecode_safely(part, first, reason, voiced_s)
            extra_time_s += safe.infer_time_s
            segments.extend(shift_segments(safe.segments, group.start_s))
        segments = [replace(seg, id=number) for number, seg in enumerate(segments)]
        return replace(
            transcript,
            text="".join(seg.text for seg in segments).strip(),
            segments=tuple(segments),
            speech_detected=bool(segments),
            guard=reasons[0],
            infer_time_s=transcript.infer_time_s + extra_time_s,
        )

    def _voiced_between(self, audio: AudioArray, speech: list[Span] | None, start_s: float, end_s: float) -> float:
        """Seconds of speech between two times of the audio (the neural VAD's spans, else webrtcvad)."""
        first, end = round(start_s * SAMPLE_RATE_HZ), round(end_s * SAMPLE_RATE_HZ)
        if speech is None:
            return self.voiced_seconds(audio[first:end])
        return sum(max(0, min(span.end, end) - max(span.start, first)) for span in speech) / SAMPLE_RATE_HZ

    def redecode_safely(self, job: AsrJob, first: Transcript, reason: GuardReason, voiced_s: float) -> Transcript:
        """Decode again as Whisper's own loop does: 30 s window, no forced prefix, the temperature
        fallback. Text on audio without speech is dropped instead."""
        started = time.perf_counter()
        if reason == "no_speech":
            return replace(self._empty(job, started), guard=reason, infer_time_s=first.infer_time_s)
        options = replace(job.options, prefix=None, temperature=DEFAULT_TEMPERATURES)
        safe = self.transcribe_one(replace(job, options=options, min_window_s=WINDOW_S))
        if check_text(safe.text, voiced_s, self.guards) is not None and len(safe.text) > len(first.text):
            # Still implausible and longer: Whisper's fallback cannot judge a short text either.
            log.info("model %s: the safe decode trips a guard too; keeping the shorter first decode", self.name)
            safe = replace(first, infer_time_s=safe.infer_time_s)
        return replace(safe, guard=reason, infer_time_s=first.infer_time_s + safe.infer_time_s)

    def voiced_seconds(self, audio: AudioArray) -> float:
        """Seconds of speech in ``audio`` by the neural VAD (webrtcvad without it)."""
        if self._neural_vad_filter:
            return spans_seconds(self._speech_spans(audio))
        from mediaserver.audio.vad import speech_ms

        return speech_ms(audio, self._vad) / 1000.0

    def _repeated_speech(self, window: Window, output: WindowOutput, run: BatchRun) -> bool:
        """Whether a full window that fails only Whisper's compression-ratio test holds speech said
        again, not a decoder loop.

        gzip cannot tell the two apart: a sentence said three times in 30 s compresses as well as a
        loop (JFK's 11 s sentence twice over: ratio 2.5). Whisper's answer, decoding again at rising
        temperatures and preferring any sample that compresses less, drops the repeats at random.
        A loop shows in what the guards measure on the window alone: a phrase following itself,
        more words than its speech could hold, or a decode run to the token cap. Without the
        guards, Whisper's test stands.
        """
        if (
            output.low_confidence
            or output.capped
            or window.encoder_s < WINDOW_S
            or not (self.guards.repeat_min and self.guards.max_words_per_s)
        ):
            return False
        member = window.members[0]
        voiced_s = self._voiced_between(
            run.jobs[member.job_index].audio,
            run.speech.get(member.job_index),
            member.job_offset_s,
            member.job_offset_s + window.duration_s,
        )
        return check_text(output.text, voiced_s, self.guards) is None

    def _doubtful_on_a_short_window(self, window: Window, output: WindowOutput, run: BatchRun) -> bool:
        """A short window's decode of a final or an upload that the full 30 s window should redo
        (``asr_window_s``): one Whisper scores above its no-speech threshold (its no-speech rule drops
        it, or keeps it unsure) on audio the VAD heard speech in, or one with a phrase of two or more
        words said twice in a row (the loop guard, ``repeat_min`` > 0, wants three). A Willow user's
        trial: a real "five five" on tiny.en's 10 s window came out "5" (no_speech_prob 0.72), or
        nothing after 2 or 10 s of silence (0.65, Whisper's rule dropped it), and a real "ten of
        clubs" after 9.5 s as "10 of close. 10 of close."; on 30 s each was heard once and whole.
        A partial keeps its short window (it is redone by the next one)."""
        if run.jobs[window.members[0].job_index].on_guard != "redecode":
            return False
        if output.no_speech_prob > NO_SPEECH_THRESHOLD:
            return True
        return bool(self.guards.repeat_min) and repeated_phrase(normalized_words(output.text), 2) is not None

    def _short_window_guard(self, window: Window, output: WindowOutput, run: BatchRun) -> GuardReason | None:
        """The guard a short window's text trips (a loop Whisper's compression test cannot see on a
        short text), recorded for the job when it is one to decode again (a final, an upload)."""
        job_index = window.members[0].job_index
        job = run.jobs[job_index]
        reason = check_text(output.text, run.voiced_s.get(job_index, window.duration_s), self.guards)
        if reason is None or reason == "no_speech" or job.on_guard != "redecode":
            return None
        self.counters[f"guard_redecode_{reason}"] += 1
        run.guarded[job_index] = reason
        return reason


def spans_seconds(spans: list[Span]) -> float:
    """Seconds of audio the spans cover (they do not overlap)."""
    return sum(span.end - span.start for span in spans) / SAMPLE_RATE_HZ
