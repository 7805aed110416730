"""The session core every streaming transport uses: audio in, speech events and transcripts out.

A ``StreamSession`` takes 16 kHz mono float audio in any chunk size. In push-to-talk mode it records
between ``start_recording`` and ``stop_recording``; in server-VAD mode its segmenter ends each
utterance by itself. While someone speaks it can send partial transcripts: only words that
``stream_partial_agreement`` consecutive partial decodes agree on (after the text already sent, and
short of each decode's last word) are sent, so partials are append-only. Every decode, partial or
final, is unforced, as an upload's is (a final says what an upload of its audio would say); the
final is joined to the promised text by ``continuation``, so it always extends the partials and
never doubles a word at the seam. Model work goes through the shared ``AsrService``; the session
only submits jobs (partials with its id as supersede key, so stale ones are dropped).

Closing is idempotent and cancels every task the session started. ``mediaserver.sessions`` holds
the registry of open sessions (the cap, idle reaping).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field, replace
from typing import Literal, Protocol, TypeVar, runtime_checkable

import numpy as np

from mediaserver.asr.scheduler import DeadlineExceeded, Superseded
from mediaserver.asr.service import AsrService
from mediaserver.audio.segmenter import Discarded, SegmenterConfig, SpeechStart, Utterance, VadSegmenter
from mediaserver.config import Settings
from mediaserver.errors import ApiError, BackendTimeout, BackendUnavailable, Overloaded
from mediaserver.events import (
    SAMPLE_RATE_HZ,
    AudioArray,
    FinalTranscript,
    PartialTranscript,
    Priority,
    SessionEvent,
    SpeechStarted,
    SpeechStopped,
    StreamError,
    Transcript,
    TranscriptionOptions,
    TurnDecided,
)
from mediaserver.turns import model as turn_models

log = logging.getLogger(__name__)

Emit = Callable[[SessionEvent], Awaitable[None]]
_T = TypeVar("_T")
_ids = itertools.count(1)


@dataclass(frozen=True)
class StreamOptions:
    model: str | None = None
    transcription: TranscriptionOptions = field(
        default_factory=lambda: TranscriptionOptions(with_segment_timestamps=False)
    )
    server_vad: bool = False
    partials: bool = False
    # Partials also carry the latest hypothesis' words after the agreed ones (may change), and are
    # sent whenever those change: words on screen one decode after the speech, not three.
    unstable_partials: bool = False
    # How a server-VAD utterance ends: "silence" (the hangover), "semantic" (the turn model scores
    # each pause; unfinished turns wait up to the eagerness cap); None = the turn_detection setting.
    turn_detection: Literal["silence", "semantic"] | None = None
    eagerness: Literal["low", "medium", "high", "auto"] | None = None


def segmenter_config(settings: Settings, **overrides: int | float) -> SegmenterConfig:
    values: dict[str, int | float] = {
        "aggressiveness": settings.stream_vad_aggressiveness,
        "hangover_ms": settings.stream_vad_hangover_ms,
        "preroll_ms": settings.stream_vad_preroll_ms,
        "min_speech_ms": settings.stream_min_speech_ms,
        "max_utterance_s": settings.stream_max_utterance_s,
    }
    values.update(overrides)
    return SegmenterConfig(**values)  # type: ignore[arg-type]


@dataclass
class _TurnCheck:
    """A pause being scored by the turn model; ``silence_from_ms`` is the stream time the pause began."""

    task: asyncio.Task[None]
    silence_from_ms: int
    silence_ms: int  # how long the pause was when it was scored


@dataclass
class _EarlyFinal:
    """A final decoded during the trailing silence, before the segmenter ends the utterance.

    It is the utterance's final if the utterance ends on this silence: then its audio is
    ``samples`` long plus exactly the rest of the hangover (any voiced frame would have restarted
    the silence and made the utterance longer).
    """

    task: asyncio.Task[Transcript]
    samples: int
    silence_ms: int


def continuation(promised: str, decoded: str) -> str:
    """The text of ``decoded`` (a final decoded without a forced prefix, as an upload is) that comes
    after the words already ``promised`` in partials, so that ``promised + continuation`` is the
    final and never repeats or splits a word at the seam.

    The promised words are aligned to the start of the decode by edit distance on normalised words
    (case and punctuation ignored), so a promised word the final decode spells or punctuates
    differently ("pairs" / "Paris", "forever." / "forever,") still lines up with its twin.
    """
    tokens = decoded.split()
    if not promised.strip():
        return " ".join(tokens)
    said = [_key(word) for word in promised.split()]
    heard = [_key(word) for word in tokens]
    # distance[j]: edit distance between all promised words and the decode's first j words.
    previous = list(range(len(heard) + 1))
    for i, word in enumerate(said, start=1):
        current = [i] + [0] * len(heard)
        for j, other in enumerate(heard, start=1):
            current[j] = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (word != other))
        previous = current
    best = min(range(len(heard) + 1), key=lambda j: (previous[j], abs(j - len(said)), -j))
    rest = " ".join(tokens[best:])
    return (" " + rest) if rest else ""


def _key(word: str) -> str:
    return "".join(ch for ch in word.lower() if ch.isalnum() or ch == "'")


class Answerer(Protocol):
    """What the session needs of a voice-loop assistant (``mediaserver.assistant.turns.Assistant``)."""

    async def answer(self, user_text: str, *, speech_ended_at: float | None = None) -> None: ...

    async def interrupt(self) -> bool: ...

    def observe_transcript(self, seconds: float) -> None: ...


@runtime_checkable
class Speculator(Protocol):
    """An answerer that can prepare an answer before the turn has ended (``Assistant``)."""

    def speculate(self, user_text: str, *, speech_ended_at: float | None = None) -> bool: ...

    def drop_speculation(self) -> None: ...


class StreamSession:
    """The transport-neutral core of one live audio stream.

    It owns the stream's segmentation (push-to-talk recording or a VAD segmenter), the partial
    transcript state of the utterance in progress (what was promised to the client, so the final
    extends it), and the tasks that wait on the shared ASR service (partials, and finals chained so
    they arrive in order). Transports feed it 16 kHz audio and translate the events it emits; they
    never call the ASR service themselves, so every transport segments and transcribes alike.

    With an ``assistant`` attached (the voice loop), each final transcript is answered, and the user
    starting to speak while an answer plays interrupts it (barge-in); the assistant's events come
    out of the same emit callback.
    """

    def __init__(
        self,
        asr: AsrService,
        settings: Settings,
        emit: Emit,
        options: StreamOptions | None = None,
        *,
        session_id: str | None = None,
        segmenter: SegmenterConfig | None = None,
        turn_model: turn_models.TurnModel | None = None,
    ) -> None:
        self.id = session_id or f"s{next(_ids)}"
        self.asr = asr
        self.settings = settings
        self.options = options or StreamOptions()
        self._emit = emit
        self._silence_config = segmenter or segmenter_config(settings)
        self._segmenter = VadSegmenter(self._silence_config)
        self._turn_model = turn_model if turn_model is not None else turn_models.shared(settings)
        self._turn_check: _TurnCheck | None = None
        self._recording = False
        self._recorded: list[AudioArray] = []
        self._committed = ""  # partial text already sent for the current utterance
        self._unstable = ""  # the words after it in the last partial (unstable_partials)
        # The latest partial hypotheses and the audio (samples) each was decoded on.
        self._hypotheses: collections.deque[tuple[str, int]] = collections.deque(maxlen=32)
        self._partial_task: asyncio.Task[None] | None = None
        self._early_final: _EarlyFinal | None = None
        self._tasks: set[asyncio.Task[object]] = set()
        self._final_chain: asyncio.Future[None] | None = None
        self._pending_finals = 0  # utterances submitted whose final was not yet sent
        self._closed = False
        self.assistant: Answerer | None = None
        self.barge_in = settings.assistant_barge_in
        self._apply_turn_mode()
        # Gaps: a sender that stops sending mid-utterance (Opus DTX, a paused track, a device that
        # sends nothing in silence) must not keep the utterance open: see _watch_gaps.
        self._segment_lock = asyncio.Lock()
        self._last_audio_at = time.monotonic()
        self._gap_filled_s = 0.0
        self._gap_task: asyncio.Task[None] | None = None
        self.last_activity = time.monotonic()
        self.samples_received = 0
        self.utterances = 0

    # --- configuration ------------------------------------------------------------------------

    def configure(self, options: StreamOptions) -> None:
        self.options = options
        self._apply_turn_mode()

    @property
    def semantic_turns(self) -> bool:
        """Whether the turn model ends this session's utterances (asked for, and the model is loaded)."""
        wanted = self.options.turn_detection or self.settings.turn_detection
        return wanted == "semantic" and self.options.server_vad and self._turn_model is not None

    def _apply_turn_mode(self) -> None:
        """Semantic turns: the segmenter's hangover becomes the eagerness cap (the longest an
        unfinished turn is waited for); the turn model ends finished turns at their first pause."""
        config = self._silence_config
        if self.semantic_turns:
            eagerness = self.options.eagerness or self.settings.turn_eagerness
            cap_ms = {
                "low": self.settings.turn_wait_low_ms,
                "high": self.settings.turn_wait_high_ms,
            }.get(eagerness, self.settings.turn_wait_medium_ms)
            config = replace(config, hangover_ms=cap_ms)
        self._segmenter.config = config

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def in_speech(self) -> bool:
        return self._recording if not self.options.server_vad else self._segmenter.in_speech

    # --- audio --------------------------------------------------------------------------------

    async def feed(self, samples: AudioArray) -> None:
        """Audio from the transport: 16 kHz mono float32, any length."""
        if self._closed or samples.size == 0:
            return
        self.last_activity = self._last_audio_at = time.monotonic()
        self._gap_filled_s = 0.0
        self.samples_received += samples.size
        if not self.options.server_vad:
            if self._recording:
                self._recorded.append(samples)
                self._ensure_partials()
            return
        await self._segment(samples)
        if self._segmenter.in_speech:
            self._ensure_partials()
            self._ensure_gap_watch()

    def audio_arriving(self) -> None:
        """Audio was received and is queued on its way to ``feed``: the time since the last audio
        must not count as a gap (see ``_watch_gaps``) while the transport's worker catches up."""
        self._last_audio_at = time.monotonic()

    async def _segment(self, samples: AudioArray) -> None:
        async with self._segment_lock:  # the gap watcher pushes too: keep events in stream order
            for event in self._segmenter.push(samples):
                await self._on_segment(event)
            self._watch_trailing_silence()

    def _watch_trailing_silence(self) -> None:
        """Start the final early once the speech has been silent long enough; drop it if speech resumed.

        With semantic turns, a pause of ``turn_candidate_silence_ms`` is also scored by the turn
        model (``_decide_turn``), and the final starts then too: it is decoded while the turn
        model decides, ready when a finished turn ends."""
        early = self._early_final
        silence_ms = self._segmenter.silence_ms
        if early is not None and self._segmenter.in_speech and silence_ms < early.silence_ms:
            self._drop_early_final()  # voiced again: this silence was a pause, not the end
            early = None
        check = self._turn_check
        if check is not None and (
            not self._segmenter.in_speech or self._segmenter.position_ms - silence_ms != check.silence_from_ms
        ):
            self._drop_turn_check()
        semantic = self.semantic_turns
        candidate_ms = self.settings.turn_candidate_silence_ms
        if semantic and self._segmenter.in_speech and silence_ms >= candidate_ms:
            check = self._turn_check
            rescore_ms = self.settings.turn_rescore_ms
            if check is None or (rescore_ms > 0 and check.task.done() and silence_ms >= check.silence_ms + rescore_ms):
                self._start_turn_check(silence_ms)  # scored unfinished: score again with more silence
        early_ms = self.settings.stream_final_early_ms
        if early_ms <= 0 or early is not None or not self._segmenter.in_speech or self._closed:
            return
        config = self._segmenter.config
        start_ms = min(candidate_ms, config.hangover_ms - early_ms) if semantic else config.hangover_ms - early_ms
        if silence_ms < max(config.frame_ms, start_ms):
            return
        self._cancel_partials()  # the final is about to be decoded: partials only compete with it now
        audio = self._segmenter.current_audio()
        task = self._start_final(audio, f"early-final-{self.id}")
        early = self._early_final = _EarlyFinal(task, audio.size, silence_ms)
        if self.settings.turn_speculative_answers and isinstance(self.assistant, Speculator):
            task.add_done_callback(lambda done: self._speculate(early, done, self._committed))

    def _speculate(self, early: _EarlyFinal, task: asyncio.Task[Transcript], committed: str) -> None:
        """The final was decoded while the turn is still open: the voice loop starts its answer now
        (held until the turn ends; dropped if the speech resumes)."""
        if task.cancelled() or task.exception() is not None or self._early_final is not early or self._closed:
            return
        assistant = self.assistant
        if not isinstance(assistant, Speculator) or not self._segmenter.in_speech:
            return
        text = committed + continuation(committed, task.result().text)
        if text.strip():
            assistant.speculate(text, speech_ended_at=time.monotonic())

    def _start_turn_check(self, silence_ms: int) -> None:
        if self._closed:
            return
        silence_from_ms = self._segmenter.position_ms - silence_ms
        task = self._start_task(
            self._decide_turn(self._segmenter.current_audio(), silence_ms, silence_from_ms), f"turn-{self.id}"
        )
        self._turn_check = _TurnCheck(task, silence_from_ms, silence_ms)

    def _drop_turn_check(self) -> None:
        check, self._turn_check = self._turn_check, None
        if check is not None and check.task is not asyncio.current_task():
            check.task.cancel()

    async def _decide_turn(self, audio: AudioArray, silence_ms: int, silence_from_ms: int) -> None:
        """Score the pause; a finished turn ends the utterance now (if the pause still goes on)."""
        model = self._turn_model
        assert model is not None
        started = time.monotonic()
        try:
            score = await model.score(audio)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("session %s: the turn model failed; this utterance ends on silence", self.id)
            return
        decision_ms = (time.monotonic() - started) * 1000.0
        first = silence_ms < self.settings.turn_candidate_silence_ms + max(1, self.settings.turn_rescore_ms)
        threshold = self.settings.turn_threshold if first else self.settings.turn_rescore_threshold
        complete = score.probability >= threshold
        metrics = self.asr.metrics
        metrics.turn_decision_seconds.labels("complete" if complete else "incomplete").observe(decision_ms / 1000.0)
        metrics.turn_batch_size.observe(score.batch)
        async with self._segment_lock:
            segmenter = self._segmenter
            if (
                self._closed
                or not segmenter.in_speech
                or segmenter.position_ms - segmenter.silence_ms != silence_from_ms
            ):
                return  # the speech went on (or ended on silence) while the model was deciding
            await self._emit(TurnDecided(complete, score.probability, decision_ms, silence_ms, segmenter.position_ms))
            if not complete:
                return  # keep listening: the speech resumes, or the eagerness cap ends the turn
            event = segmenter.end_turn()
            if event is not None:
                await self._on_segment(event)

    def _drop_early_final(self) -> None:
        if self._early_final is not None:
            self._early_final.task.cancel()
            self._early_final = None
            if isinstance(self.assistant, Speculator):
                self.assistant.drop_speculation()  # the speech resumed: an answer started on it is unheard

    def _take_early_final(self, utterance: Utterance) -> _EarlyFinal | None:
        """The early final if it is this utterance's (it ended on the silence the final started in)."""
        early, self._early_final = self._early_final, None
        if early is None:
            return None
        rest = (utterance.silence_ms - early.silence_ms) * SAMPLE_RATE_HZ // 1000
        if utterance.reason in ("silence", "turn") and rest >= 0 and utterance.audio.size == early.samples + rest:
            return early
        early.task.cancel()
        return None

    def _ensure_gap_watch(self) -> None:
        if self.settings.stream_gap_fill_ms <= 0 or self._gap_task is not None or self._closed:
            return
        self._gap_task = asyncio.get_running_loop().create_task(self._watch_gaps(), name=f"gaps-{self.id}")

    async def _watch_gaps(self) -> None:
        """While someone speaks, time without audio counts as silence once it passes
        ``stream_gap_fill_ms``: the segmenter then hears the silence it would have heard, so an
        utterance ends ``stream_vad_hangover_ms`` after speech stops whether or not packets keep
        coming (Opus DTX sends one every ~400 ms or none). Only during speech: the pre-roll before
        an onset keeps the real audio that arrived."""
        threshold_s = self.settings.stream_gap_fill_ms / 1000.0
        try:
            while self.options.server_vad and self._segmenter.in_speech and not self._closed:
                await asyncio.sleep(threshold_s / 2)
                silent_for = time.monotonic() - self._last_audio_at
                if silent_for <= threshold_s:
                    continue
                missing = int((silent_for - self._gap_filled_s) * SAMPLE_RATE_HZ)
                if missing <= 0:
                    continue
                self._gap_filled_s += missing / SAMPLE_RATE_HZ
                await self._segment(np.zeros(missing, np.float32))
        finally:
            if self._gap_task is asyncio.current_task():
                self._gap_task = None

    async def _on_segment(self, event: SpeechStart | Utterance | Discarded) -> None:
        if isinstance(event, SpeechStart):
            self._begin_utterance()
            if self.assistant is not None and self.barge_in:
                await self.assistant.interrupt()  # the user talks over the answer: stop it first
            await self._emit(SpeechStarted(event.start_ms))
        elif isinstance(event, Utterance):
            self._drop_turn_check()
            await self._emit(SpeechStopped(event.end_ms))
            await self._submit_final(event.audio, event.start_ms, event.end_ms, early=self._take_early_final(event))
        else:
            self._cancel_partials()
            self._drop_early_final()
            self._drop_turn_check()
            await self._emit(SpeechStopped(event.end_ms, discarded=True))

    # --- push-to-talk ---------------------------------------------------------------------------

    def start_recording(self) -> None:
        self._recording = True
        self._recorded = []
        self._begin_utterance()

    @property
    def recording(self) -> bool:
        return self._recording

    def recorded_audio(self) -> AudioArray:
        return np.concatenate(self._recorded) if self._recorded else np.zeros(0, np.float32)

    async def stop_recording(self) -> FinalTranscript:
        """End a push-to-talk utterance and wait for its final transcript."""
        ended_at = time.monotonic()
        self._recording = False
        audio = self.recorded_audio()
        self._recorded = []
        self._cancel_partials()
        return await self._final(audio, 0, int(audio.size * 1000 / SAMPLE_RATE_HZ), ended_at=ended_at)

    async def commit(self) -> FinalTranscript | None:
        """Finish whatever audio is buffered (server VAD) now; None when nothing was being said.

        The final arrives after the finals of earlier utterances of this session (they are chained).
        """
        if not self.options.server_vad:
            return await self.stop_recording()
        event = self._segmenter.flush()
        if event is None:
            return None
        self._drop_early_final()  # committed now: the whole audio, as it is
        self._drop_turn_check()
        if isinstance(event, Discarded):
            self._cancel_partials()
            await self._emit(SpeechStopped(event.end_ms, discarded=True))
            return None
        await self._emit(SpeechStopped(event.end_ms))
        ended_at = time.monotonic()
        previous = self._final_chain
        if previous is not None:
            with contextlib.suppress(Exception):
                await previous
        return await self._final(event.audio, event.start_ms, event.end_ms, ended_at=ended_at)

    def clear(self) -> None:
        """Drop buffered audio and any utterance in progress."""
        self._recorded = []
        self._segmenter.reset()
        self._cancel_partials()
        self._drop_early_final()
        self._drop_turn_check()
        self._forget_partials()

    # --- transcription ------------------------------------------------------------------------

    def _begin_utterance(self) -> None:
        self._cancel_partials()
        self._drop_early_final()
        self._drop_turn_check()
        self._forget_partials()

    def _current_audio(self) -> AudioArray:
        return self.recorded_audio() if not self.options.server_vad else self._segmenter.current_audio()

    def _ensure_partials(self) -> None:
        if not self.options.partials or self._partial_task is not None or self._early_final is not None or self._closed:
            return
        self._partial_task = asyncio.get_running_loop().create_task(self._partials_loop(), name=f"partials-{self.id}")

    def _cancel_partials(self) -> None:
        if self._partial_task is not None:
            self._partial_task.cancel()
            self._partial_task = None

    async def _partials_loop(self) -> None:
        """Partial decodes on a fixed cadence: one starts ``stream_partial_interval_ms`` after the
        last one started (or as soon as it returns, if it took longer), the first once the
        utterance holds ``stream_partial_min_audio_ms`` of audio."""
        interval_s = self.settings.stream_partial_interval_ms / 1000.0
        min_samples = self.settings.stream_partial_min_audio_ms * SAMPLE_RATE_HZ // 1000
        last_size = 0
        next_at = 0.0
        try:
            while self.in_speech and not self._closed:
                audio = self._current_audio()
                now = time.monotonic()
                wait_s = max(next_at - now, (min_samples - audio.size) / SAMPLE_RATE_HZ)
                if audio.size <= last_size:
                    wait_s = max(wait_s, 0.02)
                if wait_s > 0:
                    await asyncio.sleep(wait_s)
                    continue
                last_size = audio.size
                next_at = now + interval_s
                # Unforced, as the final is: a decode forced to continue the promised text carries
                # one early mishearing into every later partial and into the final.
                options = replace(self.options.transcription, prefix=None)
                try:
                    result = await self.asr.transcribe(
                        audio,
                        options,
                        model=self.options.model,
                        priority=Priority.PARTIAL,
                        supersede_key=self.id,
                    )
                except (Superseded, Overloaded, DeadlineExceeded, BackendTimeout, BackendUnavailable):
                    continue  # a partial that cannot run now is simply skipped
                if not self.in_speech:
                    return
                if result.guard is not None:
                    continue  # a loop or text on no speech: the next decode comes soon
                await self._advance_partial(result.text, audio.size)
        except asyncio.CancelledError:
            pass
        except ApiError as exc:
            await self._emit(StreamError(exc.message, exc.code))
        finally:
            if self._partial_task is asyncio.current_task():
                self._partial_task = None

    async def _advance_partial(self, hypothesis: str, audio_samples: int | None = None) -> None:
        """Send the words ``stream_partial_agreement`` consecutive hypotheses agree on, beyond what
        was already sent; with ``unstable_partials``, also the latest hypothesis' words after them
        whenever they change (``unstable``: shown at once, replaced by the next partial).

        Each hypothesis is a decode of the utterance so far; what it says after the promised words
        is found by lining them up with its start (``continuation``), so a hypothesis that spells
        or punctuates a promised word differently still counts. ``audio_samples`` is the length of
        the audio it was decoded on (None: as long as needed, for tests of the agreement alone)."""
        samples = audio_samples if audio_samples is not None else (len(self._hypotheses) + 1) * 10**9
        earlier = self._agreeing_window(samples)
        self._hypotheses.append((hypothesis, samples))
        tail = continuation(self._committed, hypothesis).split()
        agreed = self._agreed_words(tail, earlier)
        delta = ""
        if agreed:
            delta = (" " if self._committed else "") + " ".join(agreed)
            self._committed += delta
        unstable = " ".join(tail[len(agreed) :]) if self.options.unstable_partials else self._unstable
        if delta or unstable != self._unstable:
            self._unstable = unstable
            await self._emit(PartialTranscript(delta, self._committed, unstable))

    def _agreeing_window(self, samples: int) -> list[str]:
        """The earlier hypotheses a new one (decoded on ``samples``) must agree with: the last
        ``stream_partial_agreement - 1``, and back to one decoded on ``stream_partial_commit_lag_ms``
        less audio, so a promised word has survived that much more context. Empty until enough
        hypotheses have come."""
        needed = max(1, self.settings.stream_partial_agreement - 1)
        lag = self.settings.stream_partial_commit_lag_ms * SAMPLE_RATE_HZ // 1000
        window: list[str] = []
        for hypothesis, size in reversed(self._hypotheses):
            window.append(hypothesis)
            if len(window) >= needed and samples - size >= lag:
                return window
        return []

    def _agreed_words(self, tail: list[str], earlier: list[str]) -> list[str]:
        """The words at the start of ``tail`` (the latest hypothesis after the promised text) that
        every earlier hypothesis has there too, short of each one's last word: the word at the edge
        of the audio heard so far may still change, its punctuation above all ("Americans." becomes
        "Americans, ask" once the next words are heard)."""
        if not earlier:
            return []
        agreed = [_key(word) for word in tail[:-1]]
        for other in earlier:
            settled = [_key(word) for word in continuation(self._committed, other).split()[:-1]]
            common = 0
            for mine, theirs in zip(agreed, settled, strict=False):
                if mine != theirs or not mine:
                    break
                common += 1
            agreed = agreed[:common]
        return tail[: len(agreed)]

    async def _submit_final(
        self, audio: AudioArray, start_ms: int, end_ms: int, *, early: _EarlyFinal | None = None
    ) -> None:
        """Start a final without blocking the audio path; finals of a session arrive in order.

        The transcription enters the shared ASR queue at once (so the service's ``asr_max_queue``
        bounds every session's waiting finals together, and a session's backlog fills batches);
        only the results wait for the earlier utterances'. With ``early``, the final decoded during
        the trailing silence is this utterance's. A session with ``stream_max_pending_finals``
        finals already waiting drops the utterance with an ``overloaded`` error.
        """
        previous = self._final_chain
        committed = self._committed
        ended_at = time.monotonic()
        self._cancel_partials()
        self._forget_partials()
        limit = self.settings.stream_max_pending_finals
        if self._pending_finals >= limit:
            if early is not None:
                early.task.cancel()
            self.asr.metrics.stream_dropped.inc()
            log.info("session %s: utterance %d-%d ms dropped, %d finals waiting", self.id, start_ms, end_ms, limit)
            await self._emit(
                StreamError(
                    f"server overloaded: {limit} earlier utterances of this session are still waiting for their "
                    "transcripts (stream_max_pending_finals); this one was dropped",
                    Overloaded.code,
                    start_ms,
                    end_ms,
                )
            )
            return
        transcription = early.task if early is not None else self._start_final(audio, f"transcribe-{self.id}")
        self._pending_finals += 1

        async def run() -> None:
            try:
                if previous is not None:
                    with contextlib.suppress(Exception):
                        await previous
                await self._final(audio, start_ms, end_ms, committed=committed, ended_at=ended_at, early=transcription)
            except ApiError:
                pass  # _final already reported it as a StreamError
            except Exception:
                log.exception("session %s: final transcription failed", self.id)
                await self._emit(StreamError("transcription failed", "internal_error", start_ms, end_ms))
            finally:
                self._pending_finals -= 1
                transcription.cancel()  # only if this final was cancelled before it was done

        self._final_chain = self._start_task(run(), f"final-{self.id}")

    def _start_final(self, audio: AudioArray, name: str) -> asyncio.Task[Transcript]:
        """Put a final's transcription in the ASR queue now.

        A final is decoded as an upload of its audio would be, with no forced prefix: forcing the
        promised text made the decoder continue past it on the trailing silence ("... forever.
        Ferever.") and made short real commands loop. ``continuation`` joins it to the promise.
        """
        options = replace(self.options.transcription, prefix=None)
        task = self._start_task(
            self.asr.transcribe(audio, options, model=self.options.model, priority=Priority.FINAL), name
        )
        task.add_done_callback(_retrieve_exception)  # whoever awaits it handles a failure
        return task

    def _forget_partials(self) -> None:
        """The next utterance starts with nothing promised or shown."""
        self._committed = ""
        self._unstable = ""
        self._hypotheses.clear()

    def _start_task(self, coro: Coroutine[object, object, _T], name: str) -> asyncio.Task[_T]:
        """A task of this session: ``aclose`` cancels it."""
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _final(
        self,
        audio: AudioArray,
        start_ms: int,
        end_ms: int,
        *,
        committed: str | None = None,
        ended_at: float | None = None,
        early: asyncio.Task[Transcript] | None = None,
    ) -> FinalTranscript:
        """Transcribe an utterance; ``ended_at`` is when its speech ended (monotonic).

        ``early`` is its transcription already under way (started in the trailing silence, or when
        the utterance ended); if that was refused or failed, the utterance is transcribed again
        here, once: not after it already waited ``asr_request_timeout_s``.
        """
        ended_at = time.monotonic() if ended_at is None else ended_at
        committed = self._committed if committed is None else committed
        self._cancel_partials()
        options = replace(self.options.transcription, prefix=None)
        transcript: Transcript | None = None
        if early is not None:
            try:
                transcript = await early
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if current is not None and current.cancelling():
                    raise
            except DeadlineExceeded as exc:
                await self._emit(StreamError(exc.message, exc.code, start_ms, end_ms))
                raise
            except Exception:
                log.debug("session %s: the started final failed; transcribing again", self.id)
        try:
            if transcript is None:
                transcript = await self.asr.transcribe(
                    audio, options, model=self.options.model, priority=Priority.FINAL
                )
        except ApiError as exc:
            await self._emit(StreamError(exc.message, exc.code, start_ms, end_ms))
            raise
        delta = continuation(committed, transcript.text)
        text = (committed + delta) if committed else delta
        if text != transcript.text:
            transcript = replace(transcript, text=text)
        self.utterances += 1
        final = FinalTranscript(transcript, delta, start_ms, end_ms, (time.monotonic() - ended_at) * 1000.0)
        if committed == self._committed:
            self._forget_partials()
        await self._emit(final)
        if self.assistant is not None and text.strip() and not self._closed:
            self.assistant.observe_transcript(time.monotonic() - ended_at)
            await self.assistant.answer(text, speech_ended_at=ended_at)
        return final

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._cancel_partials()
        self._drop_early_final()
        self._drop_turn_check()
        if self._gap_task is not None:
            self._gap_task.cancel()
            self._gap_task = None
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()


def _retrieve_exception(task: asyncio.Task[Transcript]) -> None:
    """An early final that is dropped or fails is not an error of its own (the final retries)."""
    if not task.cancelled():
        task.exception()
