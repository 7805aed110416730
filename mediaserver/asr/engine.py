"""The Whisper engine: CTranslate2 through faster-whisper, called from one worker thread.

The interface takes a batch so the scheduler can hand it every job that is ready at once; jobs in
a batch fail independently (one bad job returns its exception, the others their transcripts).
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Protocol

import numpy as np

from mediaserver.asr.batching import BatchDecoder
from mediaserver.asr.engine_guards import GuardedDecodes, spans_seconds
from mediaserver.asr.engine_sequential import SequentialDecodes
from mediaserver.asr.guards import GUARD_REASONS, GuardConfig
from mediaserver.asr.jobs import AsrJob as AsrJob  # the engine interface's job, imported from here by its users
from mediaserver.asr.jobs import BatchRun, JobAbandoned, gone
from mediaserver.asr.windows import (
    TIMESTAMPS_PAST_S,
    WINDOW_S,
    WINDOW_SAMPLES,
    JobResult,
    Member,
    PackingConfig,
    PackingPolicy,
    Span,
    Window,
    WindowOutput,
    assign_segments,
    encoder_window_s,
    pack_windows,
    split_into_windows,
    text_loops,
    window_member,
)
from mediaserver.audio.vad import VadConfig, has_speech
from mediaserver.events import (
    SAMPLE_RATE_HZ,
    AudioArray,
    Segment,
    Transcript,
)

log = logging.getLogger(__name__)


class AsrEngine(Protocol):
    """What the service and its scheduler need of an engine that runs in the scheduler's worker thread.

    ``WhisperEngine`` (local CTranslate2) is one. Remote engines (``asr/remote.py``: Triton, an
    OpenAI-compatible server) have the same attributes but an async batch call, which the scheduler
    awaits on the event loop instead of a thread.
    """

    name: str
    multilingual: bool
    counters: dict[str, int]

    def transcribe_batch(self, jobs: Sequence[AsrJob], backlog: int = 0) -> list[Transcript | BaseException]:
        """One result per job, in order; a failed job is its exception and fails alone."""
        ...


class Route(enum.Enum):
    """Where a job goes when it does not take the batched window path."""

    SILENCE = "silence"  # no speech: an empty transcript without touching the model
    SEQUENTIAL = "sequential"  # needs faster-whisper's own loop (word timestamps, sampling)


class WhisperEngine(SequentialDecodes, GuardedDecodes):
    """One loaded CTranslate2 Whisper model and the way a batch of jobs goes through it.

    It owns the model, the batched decoder, the packing policy and the decode counters. A batch is
    planned job by job (no speech, faster-whisper's own loop, or 30 s windows), packed when the
    policy says so, decoded window group by window group, retried where a packed job's text could
    not be told apart, and assembled back per job. With ``replicas`` > 1 the scheduler calls
    ``transcribe_batch`` from that many threads at once (CTranslate2 runs each call on its own
    replica); a call keeps its state in its own ``BatchRun``, and only the counters are shared.
    """

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
        batching: bool = True,
        packing: PackingConfig | None = None,
        speech_pad_s: float = 0.3,
        replicas: int = 1,
        max_encoder_windows: int = 0,
        guards: GuardConfig | None = None,
        max_windows_per_call: int = 0,
    ) -> None:
        from faster_whisper import WhisperModel

        self.name = name
        self.model_dir = model_dir
        self._vad = vad or VadConfig()
        self._neural_vad_filter = neural_vad_filter
        self._batching = batching
        self._packing = packing or PackingConfig()
        self.packing_policy = PackingPolicy(self._packing)
        self._speech_pad_s = speech_pad_s
        self._max_tail_rounds = 4
        # Windows per generate call (0: a whole decode group at once): a long upload's windows go in
        # calls of this many, and a job whose caller has gone stops between them.
        self._max_windows_per_call = max_windows_per_call
        self.guards = guards or GuardConfig()
        started = time.perf_counter()
        self.model = WhisperModel(
            model_dir,
            device=device,
            device_index=list(device_index),
            compute_type=compute_type,
            cpu_threads=cpu_threads,
            num_workers=replicas,  # CTranslate2 inter_threads: batches run at once, weights shared
        )
        self.replicas = replicas
        self.multilingual: bool = bool(self.model.model.is_multilingual)
        self._decoder = BatchDecoder(self.model, max_encoder_windows=max_encoder_windows)
        self._decoder.on_encode = self.packing_policy.observe_encoder
        # Counters for benchmarks and logs: how often the fast path had to fall back.
        self.counters: dict[str, int] = {
            "windows": 0,
            "packed_windows": 0,
            "repacked": 0,
            "unpack_retries": 0,
            "sequential": 0,
            "jobs_packed": 0,
            "jobs_alone": 0,
            "short_windows": 0,
            "short_window_retries": 0,
            "window_fallbacks": 0,
            "abandoned": 0,  # windows not decoded: nobody waited for their jobs any more
            **{f"guard_{action}_{reason}": 0 for action in ("redecode", "keep") for reason in GUARD_REASONS},
        }
        log.info(
            "loaded model %s from %s on %s/%s in %.2f s (multilingual=%s)",
            name,
            model_dir,
            device,
            compute_type,
            time.perf_counter() - started,
            self.multilingual,
        )

    def transcribe_batch(self, jobs: Sequence[AsrJob], backlog: int = 0) -> list[Transcript | BaseException]:
        """Transcribe jobs together: one encoder pass and one generate call per decode group.

        ``backlog`` is how many more jobs wait in the queue behind these: with them, the packing
        policy decides whether short jobs share windows in this batch.
        """
        started = time.perf_counter()
        pack = self.packing_policy.should_pack(len(jobs) + backlog)
        run = BatchRun(jobs, [None] * len(jobs))
        windows: list[Window] = []
        singles: list[Window] = []
        for index, job in enumerate(jobs):
            if gone(job):
                run.results[index] = JobAbandoned()
                continue
            try:
                plan = self._plan(index, job, run)
            except Exception as exc:
                log.exception("ASR job failed on model %s", self.name)
                run.results[index] = exc
                continue
            if plan is Route.SILENCE:
                run.results[index] = self._empty(job, started)
            elif plan is Route.SEQUENTIAL:
                run.fall_back(index)
            else:
                run.states[index] = self._new_state(job)
                if (
                    pack
                    and len(plan) == 1
                    and plan[0].language is not None
                    and plan[0].duration_s <= self._packing.max_job_s
                    and plan[0].encoder_s >= WINDOW_S  # a short window is cheaper alone
                ):
                    singles.append(plan[0])
                else:
                    windows.extend(plan)
        if singles:
            windows.extend(pack_windows(singles, gap_s=self._packing.gap_s, max_window_s=self._packing.max_window_s))
        self.counters["windows"] += len(windows)
        self.counters["short_windows"] += sum(w.encoder_s < WINDOW_S for w in windows)
        self.counters["packed_windows"] += sum(w.packed for w in windows)
        packed_jobs = sum(len(w.members) for w in windows if w.packed)
        self.counters["jobs_packed"] += packed_jobs
        self.counters["jobs_alone"] += len(run.states) + len(run.sequential) - packed_jobs
        retry = self._decode(windows, run)
        if retry:
            self._retry(run, sorted(retry), {w.members[0].job_index: w for w in singles})
        elapsed = time.perf_counter() - started
        for index, state in run.states.items():
            if run.results[index] is not None or index in run.sequential:
                continue
            run.results[index] = self._assemble(jobs[index], state, elapsed)
        self.counters["sequential"] += len(run.sequential)
        for index in run.sequential:
            if gone(jobs[index]):
                run.results[index] = JobAbandoned()
                continue
            try:
                run.results[index] = self.transcribe_one(jobs[index])
            except JobAbandoned as exc:  # (its caller went while it was decoded: nobody's error)
                self.counters["abandoned"] += 1
                run.results[index] = exc
            except Exception as exc:
                log.exception("ASR job failed on model %s", self.name)
                run.results[index] = exc
        for index, result in enumerate(run.results):
            if isinstance(result, Transcript) and result.text and not gone(jobs[index]):
                try:
                    result = self._guarded(jobs[index], result, run.voiced_s.get(index), run.speech.get(index))
                except JobAbandoned as exc:  # its caller went during a redecode: the others' results stand
                    self.counters["abandoned"] += 1
                    run.results[index] = exc
                    continue
                if result.guard is None and index in run.guarded:
                    result = replace(result, guard=run.guarded[index])  # decoded again on 30 s
                run.results[index] = result
        return [r if r is not None else RuntimeError("job produced no result") for r in run.results]

    def _retry(self, run: BatchRun, retry: list[int], single_of: dict[int, Window]) -> None:
        """Decode again the packed jobs whose text could not be told apart or was left unfinished.

        First packed once more, in arrival order (new neighbours) and with twice the gap, which
        splits most of them cleanly at the cost of one shared window; what still fails runs alone.
        Every retried job was packed, so each has its single window in ``single_of``.
        """
        for i in retry:
            run.states[i] = self._new_state(run.jobs[i])
        if len(retry) > 1:
            again = pack_windows(
                [single_of[i] for i in retry],
                gap_s=2 * self._packing.gap_s,
                max_window_s=self._packing.max_window_s,
                by_duration=False,
            )
            self.counters["repacked"] += len(retry)
            retry = sorted(self._decode(again, run))
            for i in retry:
                run.states[i] = self._new_state(run.jobs[i])
        self.counters["unpack_retries"] += len(retry)
        self._decode([single_of[i] for i in retry], run)

    # --- batched path -------------------------------------------------------------------------

    def _language_of(self, job: AsrJob) -> str | None:
        return job.options.language if self.multilingual else "en"

    def _new_state(self, job: AsrJob) -> JobResult:
        return JobResult(language=self._language_of(job) or "en")

    def _plan(self, index: int, job: AsrJob, run: BatchRun) -> list[Window] | Route:
        """The job's windows, or where it goes instead."""
        if not has_speech(job.audio, self._vad):
            return Route.SILENCE
        options = job.options
        if not self._batching or options.word_timestamps or (options.temperature and options.temperature[0] > 0):
            return Route.SEQUENTIAL
        return self._plan_windows(index, job, run) or Route.SILENCE

    def _plan_windows(self, index: int, job: AsrJob, run: BatchRun) -> list[Window]:
        audio = job.audio
        speech = self._speech_spans(audio)
        run.voiced_s[index] = spans_seconds(speech)
        run.speech[index] = speech
        spans = split_into_windows(speech, audio.size, int(self._speech_pad_s * SAMPLE_RATE_HZ))
        # A short encoder window only for a job that fits in one (a partial of an utterance so far),
        # and has no prompt: with one, tiny.en on a 10 s window said a 3 s sentence twice over
        # ("... across the table. He turned sharply ..."), on the full window once (asr/vocabulary.py).
        short = job.min_window_s < WINDOW_S and len(spans) == 1 and not job.options.initial_prompt
        windows = []
        for number, span in enumerate(spans):
            # A forced prefix belongs to the start of the audio, so only to the first window.
            options = job.options if number == 0 else replace(job.options, prefix=None)
            lead = _lead(speech, span, round(job.lead_s * SAMPLE_RATE_HZ))
            windows.append(
                Window(
                    audio=np.ascontiguousarray(audio[span.start : span.end], dtype=np.float32),
                    members=[Member(index, 0.0, (span.end - span.start) / SAMPLE_RATE_HZ, span.start / SAMPLE_RATE_HZ)],
                    options=options,
                    # Timestamps show where Whisper stopped, so nothing in a long window is dropped.
                    # A forced prefix is only supported without timestamps (streaming utterances).
                    # Every window of a job of several: a decode without them that ends early
                    # drops the rest of its window unseen (a whole sentence at a long upload's end).
                    with_timestamps=not options.prefix
                    and (
                        options.with_segment_timestamps
                        or len(spans) > 1
                        or (span.end - span.start) > TIMESTAMPS_PAST_S * SAMPLE_RATE_HZ
                    ),
                    language=self._language_of(job),
                    encoder_s=encoder_window_s(span.end - span.start + lead, job.min_window_s) if short else WINDOW_S,
                    lead_s=lead / SAMPLE_RATE_HZ,
                )
            )
        return windows

    def _speech_spans(self, audio: AudioArray) -> list[Span]:
        if not self._neural_vad_filter:
            return [Span(0, audio.size)]
        from faster_whisper.vad import VadOptions, get_speech_timestamps

        options = VadOptions(min_silence_duration_ms=500, speech_pad_ms=0, max_speech_duration_s=25.0)
        return [Span(int(t["start"]), int(t["end"])) for t in get_speech_timestamps(audio, options)]

    def _decode(self, windows: list[Window], run: BatchRun) -> set[int]:
        """Decode windows, then any unfinished tails, until every window's text is complete.

        Returns the packed jobs whose text could not be told apart and must be decoded again.
        """
        retry: set[int] = set()
        rounds = 0
        while windows:
            rounds += 1
            tails: list[Window] = []
            groups: dict[int, list[Window]] = {}
            for window in windows:
                groups.setdefault(window.options.beam_size, []).append(window)
            step = self._max_windows_per_call or max(len(group) for group in groups.values())
            chunks = [group[first : first + step] for group in groups.values() for first in range(0, len(group), step)]
            for chunk in chunks:
                # A window whose every job's caller has gone is not decoded: a long upload whose
                # client hung up stops here, between generate calls, instead of running for nobody.
                kept = [w for w in chunk if not all(gone(run.jobs[m.job_index]) for m in w.members)]
                self.counters["abandoned"] += len(chunk) - len(kept)
                chunk = kept
                for window, output in self._run_group(chunk, run) if chunk else ():
                    if output is None:
                        continue
                    if window.packed:
                        retry |= self._take_packed(window, output, run)
                    else:
                        tail = self._take_single(window, output, run)
                        if tail is not None:
                            tails.append(tail)
            if rounds >= self._max_tail_rounds and tails:
                for tail in tails:
                    for member in tail.members:
                        run.fall_back(member.job_index)
                break
            windows = tails
        return retry

    def _take_packed(self, window: Window, output: WindowOutput, run: BatchRun) -> set[int]:
        """Record a packed window's text per job; return the jobs to decode again."""
        if output.low_confidence:  # the decode looks wrong: redo every job in the window
            return {m.job_index for m in window.members}
        assignment = assign_segments(window, output)
        retry = set(assignment.unsure)  # text ran across two jobs: redo just those
        for job_index, segs in assignment.segments.items():
            finished = window_member(window, job_index).window_end_s <= output.complete_until_s + 0.2
            if segs and finished and not text_loops(segs):
                offset_s = window_member(window, job_index).job_offset_s
                self._add(run.states[job_index], [dict(seg, window_s=offset_s) for seg in segs], output)
            else:  # skipped, unfinished or looping: redo this job's speech
                retry.add(job_index)
        return retry

    def _take_single(self, window: Window, output: WindowOutput, run: BatchRun) -> Window | None:
        """Record a one-job window's segments; return its unfinished tail, if any."""
        member = window.members[0]
        if gone(run.jobs[member.job_index]):
            # Its caller went meanwhile: no fallback or redo runs for nobody (a trial's long upload,
            # hung up on, went on through each window's temperature fallback, ~6 s a window).
            run.results[member.job_index] = JobAbandoned()
            return None
        if window.encoder_s < WINDOW_S and (
            output.capped
            or output.needs_fallback
            or text_loops(output.segments)
            or self._short_window_guard(window, output, run) is not None
            or self._doubtful_on_a_short_window(window, output, run)
        ):
            # A short window's decode that looks wrong gets the full window before any fallback.
            self.counters["short_window_retries"] += 1
            return replace(window, encoder_s=WINDOW_S)
        if output.needs_fallback and not self._repeated_speech(window, output, run):
            if window.audio.size >= run.jobs[member.job_index].audio.size:
                run.fall_back(member.job_index)
            else:
                try:
                    self._decode_window_alone(window, run)
                except JobAbandoned as exc:  # its caller went meanwhile: only that job ends
                    self.counters["abandoned"] += 1
                    run.results[member.job_index] = exc
            return None
        if output.is_silence:
            return None
        kept = [seg for seg in output.segments if seg["start"] < output.complete_until_s]
        shifted = [
            dict(
                seg,
                start=seg["start"] + member.job_offset_s,
                end=seg["end"] + member.job_offset_s,
                window_s=member.job_offset_s,
            )
            for seg in kept
        ]
        self._add(run.states[member.job_index], shifted, output)
        if output.complete_until_s >= window.duration_s - 0.3:
            return None
        cut = int(output.complete_until_s * SAMPLE_RATE_HZ)
        rest = window.audio[cut:]
        return Window(
            audio=rest,
            members=[
                Member(member.job_index, 0.0, rest.size / SAMPLE_RATE_HZ, member.job_offset_s + cut / SAMPLE_RATE_HZ)
            ],
            options=window.options,
            with_timestamps=True,
            language=window.language or run.states[member.job_index].language,
            follows=" ".join([window.follows, *(seg["text"].strip() for seg in kept)]).strip(),
        )

    def _decode_window_alone(self, window: Window, run: BatchRun) -> None:
        """Decode one window of a longer job through faster-whisper's own loop (temperature
        fallback), and record its segments in job time.

        Only this window's audio: one doubtful window (often a second of speech Whisper left
        unfinished at a window's end) must not send a long upload's every window, decoded well
        already, through the fallback's sampling again.
        """
        member = window.members[0]
        job = run.jobs[member.job_index]
        self.counters["window_fallbacks"] += 1
        options = replace(window.options, with_segment_timestamps=True)
        part = self.transcribe_one(replace(job, audio=window.audio, options=options))
        if not part.segments:
            return
        segments = [
            {
                "start": seg.start_s + member.job_offset_s,
                "end": seg.end_s + member.job_offset_s,
                "text": seg.text,
                "tokens": seg.tokens,
                "window_s": member.job_offset_s,
            }
            for seg in part.segments
        ]
        scores = WindowOutput(
            segments=segments,
            language=part.language,
            language_probability=_reported(part.language_probability),
            avg_logprob=min(_reported(seg.avg_logprob) for seg in part.segments),
            no_speech_prob=max(_reported(seg.no_speech_prob) for seg in part.segments),
            compression_ratio=max(_reported(seg.compression_ratio) for seg in part.segments),
            temperature=max(_reported(seg.temperature) for seg in part.segments),
        )
        self._add(run.states[member.job_index], segments, scores)

    def _run_group(self, group: list[Window], run: BatchRun) -> list[tuple[Window, WindowOutput | None]]:
        try:
            return list(zip(group, self._decoder.run(group), strict=True))
        except Exception:
            if len(group) == 1:
                log.exception("ASR window failed on model %s", self.name)
                for member in group[0].members:
                    run.results[member.job_index] = RuntimeError("transcription failed")
                return [(group[0], None)]
        # One bad window must not fail the others: run them one by one.
        pairs: list[tuple[Window, WindowOutput | None]] = []
        for window in group:
            try:
                pairs.append((window, self._decoder.run([window])[0]))
            except Exception as exc:
                log.exception("ASR window failed on model %s", self.name)
                for member in window.members:
                    run.results[member.job_index] = exc
                pairs.append((window, None))
        return pairs

    @staticmethod
    def _add(state: JobResult, segments: list[dict[str, Any]], output: WindowOutput) -> None:
        if not state.windows_seen:
            state.language = output.language
            state.language_probability = output.language_probability
        state.windows_seen += 1
        for seg in segments:
            state.raw.append((seg, output))

    def _assemble(self, job: AsrJob, state: JobResult, elapsed_s: float) -> Transcript:
        ordered = sorted(state.raw, key=lambda pair: float(pair[0]["start"]))
        segments: list[Segment] = []
        for seg, output in ordered:
            start = float(seg["start"])
            segments.append(
                Segment(
                    id=len(segments),
                    # Whisper's meaning: where the window this segment was decoded in starts (10 ms frames).
                    seek=round(float(seg.get("window_s", start)) * 100),
                    start_s=start,
                    end_s=float(seg["end"]),
                    text=str(seg["text"]),
                    tokens=tuple(seg["tokens"]),
                    temperature=output.temperature,
                    avg_logprob=output.avg_logprob,
                    compression_ratio=output.compression_ratio,
                    no_speech_prob=output.no_speech_prob,
                )
            )
        return Transcript(
            text="".join(s.text for s in segments).strip(),
            language=state.language,
            language_probability=state.language_probability,
            duration_s=job.audio.size / SAMPLE_RATE_HZ,
            segments=tuple(segments),
            infer_time_s=elapsed_s,
            model=self.name,
            task=job.options.task,
            speech_detected=bool(segments),
        )

    def _empty(self, job: AsrJob, started: float) -> Transcript:
        return Transcript(
            text="",
            language=self._language_of(job) or "en",
            language_probability=None,  # no speech: no language was detected
            duration_s=job.audio.size / SAMPLE_RATE_HZ,
            infer_time_s=time.perf_counter() - started,
            model=self.name,
            task=job.options.task,
            speech_detected=False,
        )

    # --- the model (the sequential path: engine_sequential.py) -------------------------------

    def close(self) -> None:
        """Free the model's weights now (CTranslate2's ``unload_model``), not whenever the last
        reference goes: idle unload (``asr_keep_alive_s``) and eviction return the memory at once.
        Blocking (a large model takes a while): call it off the event loop, after the last batch."""
        self.model.model.unload_model()


def _reported(score: float | None) -> float:
    """A score of a faster-whisper decode, which reports every one (only remote engines may not)."""
    assert score is not None, "faster-whisper reports every score"
    return score


def _lead(speech: list[Span], span: Span, lead_samples: int) -> int:
    """Samples of silence the window ``span`` gets before it (``Window.lead_s``): where it starts
    the audio and the speech starts at once (in the first half of ``lead_samples``, ``AsrJob.lead_s``:
    Silero's first frames), up to ``lead_samples`` before the speech; never so much that the
    window's audio no longer fits Whisper's 30 s. (A lead where the speech starts later changed
    mid-sentence words of base's decodes as often as it helped: tools/README.md, eval_lead.py.)"""
    if span.start != 0 or not speech or speech[0].start >= lead_samples // 2:
        return 0
    lead = lead_samples - speech[0].start
    return lead if span.end - span.start + lead <= WINDOW_SAMPLES else 0
