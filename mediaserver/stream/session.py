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

Four parts live beside it: ``partials.py`` (the partial decodes and what they promised:
``continuation``, the agreement rule, the commit lag), ``pauses.py`` (the pause under way: its
early final and what ends the turn in it), ``turns.py`` (the turn check: the turn model's and the
text's scoring of pauses) and ``finals.py`` (final transcriptions, started early and sent in
order); ``gaps.py`` hears a sender's gaps as silence. Closing is idempotent and cancels every
task the session started.
``echo_attach.py`` holds the session's side of a transport's echo canceller;
``session_registry.py`` holds the registry of open sessions (the cap, idle reaping).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import replace
from typing import TypeVar

from mediaserver.asr.service import AsrService
from mediaserver.audio.echo_line import EchoLine
from mediaserver.audio.segmenter import Discarded, SegmenterConfig, SpeechStart, Utterance, VadSegmenter
from mediaserver.config import Settings
from mediaserver.events import (
    SAMPLE_RATE_HZ,
    AudioArray,
    FinalTranscript,
    SessionEvent,
    SpeakerMatch,
    SpeechStarted,
    SpeechStopped,
    StreamError,
    Transcript,
)
from mediaserver.speakers.service import SpeakerService
from mediaserver.stream import speaker
from mediaserver.stream.answering import Answerer, HeldWords, QuestionPrefiller
from mediaserver.stream.barge_in import BargeIn
from mediaserver.stream.echo_attach import SessionEcho
from mediaserver.stream.echo_check import Hold
from mediaserver.stream.finals import EarlyFinal, Finals, speech_ended_at
from mediaserver.stream.gaps import GapFill, hear_sender_gap
from mediaserver.stream.options import StreamOptions, segmenter_config
from mediaserver.stream.partials import Partials, continuation
from mediaserver.stream.pauses import Pauses
from mediaserver.stream.recording import Recording
from mediaserver.stream.turns import TurnChecks
from mediaserver.turns import model as turn_models
from mediaserver.turns.text_eou import TextEou

Emit = Callable[[SessionEvent], Awaitable[None]]
log = logging.getLogger(__name__)


_T = TypeVar("_T")
_ids = itertools.count(1)


class StreamSession:
    """The transport-neutral core of one live audio stream.

    It owns the stream's segmentation (push-to-talk recording or a VAD segmenter), the partial
    transcript state of the utterance in progress (``Partials``: what was promised to the client,
    so the final extends it), the turn check (``TurnChecks``), and the tasks that wait on the
    shared ASR service (partials, and ``Finals`` chained so they arrive in order). Transports feed
    it 16 kHz audio and translate the events it emits; they never call the ASR service themselves,
    so every transport segments and transcribes alike.

    With an ``assistant`` attached (the voice loop), each final transcript is answered, and the user
    starting to speak while an answer plays interrupts it (barge-in: paused first, and resumed if the
    utterance's words are the answer's own echo, ``echo_check.py``); the assistant's events come
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
        text_eou: TextEou | None = None,
        route: str = "stream",
    ) -> None:
        self.id = session_id or f"s{next(_ids)}"
        # Its audio counts in mediaserver_audio_seconds_total under this route (ws, rtc, realtime).
        self._audio_seconds = asr.metrics.audio_seconds.labels(route)
        self.asr = asr
        self.settings = settings
        self.options = options or StreamOptions()
        self._emit = emit
        self._silence_config = segmenter or segmenter_config(settings)
        self._segmenter = VadSegmenter(self._silence_config)
        model = turn_model if turn_model is not None else turn_models.shared(settings)
        # turn_text_model "llm": the app's text scorer (turns/text_eou.py); None: off
        self._turns = TurnChecks(model, settings, asr.metrics, self.id, text_eou)
        self._recording = False
        self._recorded = Recording(settings.stream_max_recording_s)
        self._partials = Partials(self, emit)  # the decodes of the utterance in progress, what they promised
        self._tasks: set[asyncio.Task[object]] = set()
        self._finals = Finals(self, emit, self._start_task)  # transcriptions under way, sent in order
        self._segment_lock = asyncio.Lock()  # the gap watcher pushes too: keep events in stream order
        # The pause under way: its early final and its turn check (pauses.py).
        self._pauses = Pauses(
            self,
            segmenter=self._segmenter,
            turns=self._turns,
            partials=self._partials,
            finals=self._finals,
            emit=emit,
            segment_lock=self._segment_lock,
            start_task=self._start_task,
            on_segment=self._on_segment,
        )
        self._closed = False
        self._assistant: Answerer | None = None  # the voice loop's, set by the transport (``assistant``)
        self.speakers: SpeakerService | None = None  # set by the transport: finals then name their speaker
        self._echo_attached = SessionEcho(self.id, settings, asr.metrics)  # the transport's canceller (attach_echo)
        # A final that came in after the user had begun the next utterance: answered with that one's
        # words, or alone once it ends with none (``_answer_held``).
        self._held_words = HeldWords(self.id)
        # The user speaking over the answer: cut, or paused while their words decide (barge_in.py).
        self._barge_in = BargeIn(self.id, settings, self._start_task, self._answer_waits_changed)
        self._apply_turn_mode()
        # Time without audio while someone speaks is heard as silence (gaps.py).
        self._gaps = GapFill(self.id, settings.stream_gap_fill_ms, self._hear_gap, self._listening)
        self.last_activity = time.monotonic()
        self.samples_received = 0
        self.utterances = 0
        asr.streams.add(self)  # (last: only a whole session is asked whether it speaks)

    # --- configuration ------------------------------------------------------------------------

    def configure(self, options: StreamOptions) -> None:
        self.options = options
        if not options.server_vad and self._barge_in.deferred_start is not None:
            # Nothing will decide a deferred start now (push-to-talk): the answer plays as written.
            self._barge_in.cleared(self.assistant)
        self._apply_turn_mode()

    @property
    def semantic_turns(self) -> bool:
        """Whether the turn model ends this session's utterances (asked for, and the model is loaded)."""
        answering = self._assistant is not None
        return self._turns.semantic(self.options.turn_detection, self.options.server_vad, answering=answering)

    def turn_described(self) -> dict[str, str]:
        """How this session's utterances end, as its session events report it (``TurnChecks.described``)."""
        options = self.options
        return self._turns.described(
            options.turn_detection,
            options.eagerness,
            options.server_vad,
            answering=self._assistant is not None,
            hangover_ms=self._silence_config.hangover_ms,
        )

    def _answer_waits_changed(self) -> None:
        """The utterance in progress holds the paused answer, or no longer does (barge_in.py)."""
        self._echo_attached.answer_waits(self._barge_in.answer_waits, self._segmenter)
        self._apply_turn_mode()

    def _apply_turn_mode(self) -> None:
        """The segmenter ends utterances as the turn mode says (``TurnChecks.segmenter_config``)."""
        self._segmenter.config = self._turns.segmenter_config(
            self._silence_config,
            self.options.eagerness,
            semantic=self.semantic_turns,
            answer_waits=self._barge_in.answer_waits,
        )

    @property
    def assistant(self) -> Answerer | None:
        """The voice loop answering this stream's finals (set by the transport), or None."""
        return self._assistant

    @assistant.setter
    def assistant(self, assistant: Answerer | None) -> None:
        # The turn_detection setting's 'auto' depends on it: semantic turns while the server answers.
        if assistant is not self._assistant:
            self._held_words = HeldWords(self.id)  # words held for another assistant are not this one's
        self._assistant = assistant
        self._echo_attached.answering(assistant is not None, self._segmenter)
        self._apply_turn_mode()

    @property
    def barge_in(self) -> bool:
        """Speech starting over the answer stops it (``assistant_barge_in``; the transport may turn it
        off for its session)."""
        return self._barge_in.enabled

    @barge_in.setter
    def barge_in(self, enabled: bool) -> None:
        self._barge_in.enabled = enabled

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def in_speech(self) -> bool:
        return self._recording if not self.options.server_vad else self._segmenter.in_speech

    @property
    def position_ms(self) -> int:
        """The stream's clock: the audio received so far (fed or skipped), on which the server-VAD
        events' times count."""
        return self._segmenter.position_ms

    @property
    def speaking(self) -> bool:
        """Someone is heard speaking now: the VAD's utterance in progress. A push-to-talk or
        manually committed stream (a Realtime session without turn detection records all the time)
        does not say, and counts as not speaking."""
        return self.options.server_vad and self._segmenter.in_speech

    # --- audio --------------------------------------------------------------------------------

    def attach_echo(self, line: EchoLine | None) -> None:
        """The transport's echo canceller cleans the audio fed here, or no longer does (None):
        ``SessionEcho.attach`` (echo_attach.py)."""
        self._echo_attached.attach(line, self._segmenter)
        self._echo_attached.answering(self._assistant is not None, self._segmenter)

    async def feed(self, samples: AudioArray) -> None:
        """Audio from the transport: 16 kHz mono float32, any length."""
        if self._closed or samples.size == 0:
            return
        self.last_activity = time.monotonic()
        self._gaps.audio_came()
        self.samples_received += samples.size
        self._audio_seconds.inc(samples.size / SAMPLE_RATE_HZ)
        if not self.options.server_vad:
            if self._recording:
                await self._record(samples)
            return
        with self._gaps.feeding():
            await self._segment(samples)
        if self._segmenter.in_speech:
            self._ensure_partials()
            if not self._closed:
                self._gaps.watch()

    async def decided(self) -> None:
        """Until a turn decision under way on the audio fed so far (semantic turns) is made, and the
        ``speech_stopped`` it ends the utterance with is sent (at most ``turn_decision_hold_ms``)."""
        await self._turns.decided()

    def skip(self, samples: int, *, received: bool = True) -> None:
        """Audio of this stream that a wake-word gate kept from it: no speech, but stream time
        (the times of server-VAD events count the audio received, whether or not it was heard).
        ``received`` False: time the sender sent nothing for (``gap``), not counted as audio."""
        if self._closed:
            return
        if received:
            self._audio_seconds.inc(samples / SAMPLE_RATE_HZ)  # (received all the same: docs/operations.md)
            self._gaps.audio_came()  # (any gap is over: its silence heard is not taken off the next one)
        if self.options.server_vad:
            self._segmenter.skip(samples)

    @property
    def gap_heard_samples(self) -> int:
        """Of the sender's gap under way, the silence ``GapFill`` has heard already."""
        return round(self._gaps.filled_s * SAMPLE_RATE_HZ)

    async def gap(self, samples: int, *, net: bool = False) -> None:
        """The sender says it sent nothing for ``samples`` of audio (Opus DTX in silence: its
        timestamps jump): the stream's clock goes on by them, as the silence they stand for, so events'
        times count from the start of the stream (a browser trial's Realtime call gave a question
        1.5 s in ``audio_start_ms`` 150). What ``GapFill`` already heard of it is not counted twice
        (``net``: the caller took it off, as it queued the gap behind audio). Under speech it is heard
        as silence until the utterance ends (at most ``MAX_GAP_HEARD_S``), then it only moves the clock."""
        if self._closed:
            return
        missing = samples if net else samples - self.gap_heard_samples
        heard = await hear_sender_gap(missing, self._listening, self._segment)
        if missing > heard:
            self.skip(missing - heard, received=False)

    def audio_arriving(self) -> None:
        """Audio was received and is queued on its way to ``feed``: the time since the last audio
        must not count as a gap (gaps.py) while the transport's worker catches up."""
        self._gaps.arriving()

    async def _segment(self, samples: AudioArray, *, gap_after: float | None = None) -> None:
        """Segment audio, in stream order. ``gap_after``: the samples are the gap watcher's silence
        for the time since audio last came (then); audio that came while they waited to be heard (a
        pause being judged) shows there was no gap, and they are dropped (``GapFill.outdated``)."""
        await self._turns.settled()  # a pause being judged is judged before more audio is heard
        await self._pauses.words_settled()
        await self._turns.text_settled(self._segmenter.silence_ms)
        async with self._segment_lock:
            if gap_after is not None and self._gaps.outdated(gap_after):
                return
            for event in self._segmenter.push(samples):
                await self._on_segment(event)
            segmenter = self._segmenter
            if (
                self._barge_in.deferred_start is not None
                and segmenter.long_enough
                and self._barge_in.reached(segmenter.position_ms - segmenter.silence_ms)
            ):
                await self._undefer()
            self._pauses.watch()
            await self._pauses.end_turn_on_silence()

    async def _hear_gap(self, silence: AudioArray, gap_after: float) -> None:
        await self._segment(silence, gap_after=gap_after)

    def _listening(self) -> bool:
        return self.options.server_vad and self._segmenter.in_speech and not self._closed

    async def _on_segment(self, event: SpeechStart | Utterance | Discarded) -> None:
        if isinstance(event, SpeechStart):
            self._begin_utterance()
            cancelled, position_ms = self._echo_attached.cancelling, self._segmenter.position_ms
            if await self._barge_in.started(self.assistant, event, cancelled=cancelled, position_ms=position_ms):
                await self._emit(SpeechStarted(event.start_ms))
        elif isinstance(event, Utterance):
            await self._undefer(voiced_to_ms=event.end_ms - event.silence_ms)
            if event.reason == "silence" and self.semantic_turns and not self._barge_in.answer_waits:
                self.asr.metrics.turn_ends.labels("cap").inc()  # nothing decided the turn: the eagerness cap ended it
            self._barge_in.waits(False)
            self._turns.drop()
            await self._emit(SpeechStopped(event.end_ms))
            early, held = self._pauses.take_early(event), self._held(event.start_ms, event.end_ms)
            await self._submit_final(
                event.audio, event.start_ms, event.end_ms, early=early, held=held, silence_ms=event.silence_ms
            )
        else:
            self._partials.cancel()
            self._pauses.drop_early()
            self._turns.drop()
            if self._barge_in.discarded(self.assistant):
                await self._emit(SpeechStopped(event.end_ms, discarded=True))
            await self._answer_held()

    async def _undefer(self, voiced_to_ms: int | None = None) -> None:
        """A deferred start long enough to be kept (``BargeIn.undefer``; ``voiced_to_ms``: its utterance
        ended, its voice there) is told now."""
        cancelled = self._echo_attached.cancelling
        start_ms = await self._barge_in.undefer(self.assistant, cancelled=cancelled, voiced_to_ms=voiced_to_ms)
        if start_ms is None:
            return
        await self._emit(SpeechStarted(start_ms))
        if self._segmenter.in_speech:
            self._ensure_partials()

    # --- push-to-talk ---------------------------------------------------------------------------

    def start_recording(self) -> None:
        self._recording = True
        self._recorded.reset()
        self._begin_utterance()

    async def _record(self, samples: AudioArray) -> None:
        """Keep push-to-talk audio, up to ``stream_max_recording_s`` a recording: what comes past it
        is dropped, with one ``recording_too_long`` error (its ``stop`` still gets the final of what
        was kept). A review found a recording without a bound: 20 minutes sent at once held 77 MB."""
        kept, first_drop = self._recorded.keep(samples)
        if first_drop:
            await self._emit(StreamError(self._recorded.too_long(), "recording_too_long"))
        if kept:
            self._ensure_partials()

    @property
    def recording(self) -> bool:
        return self._recording

    def recorded_audio(self) -> AudioArray:
        return self._recorded.audio()

    async def stop_recording(self) -> FinalTranscript:
        """End a push-to-talk utterance and wait for its final transcript."""
        ended_at = time.monotonic()
        self._recording = False
        audio = self.recorded_audio()
        self._recorded.reset()
        self._partials.cancel()
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
        self._pauses.drop_early()  # committed now: the whole audio, as it is
        self._turns.drop()
        self._barge_in.waits(False)
        if isinstance(event, Discarded):
            await self._on_segment(event)  # as the segmenter's own discards
            return None
        await self._undefer()
        await self._emit(SpeechStopped(event.end_ms))
        ended_at, held = time.monotonic(), self._held(event.start_ms, event.end_ms)
        await self._finals.wait()
        return await self._final(event.audio, event.start_ms, event.end_ms, ended_at=ended_at, held=held)

    def _held(self, start_ms: int, end_ms: int) -> Hold | None:
        """The utterance that just ended: its hold, if the answer waits on it (``BargeIn.ended``)."""
        return self._barge_in.ended(self._echo_attached, self._segmenter.position_ms, start_ms, end_ms)

    def clear(self) -> None:
        """Drop buffered audio and any utterance in progress."""
        self._recorded.reset()
        self._barge_in.cleared(self.assistant)  # an answer paused for it goes on
        self._segmenter.reset()
        self._partials.cancel()
        self._pauses.drop_early()
        self._turns.drop()
        self._partials.promises.forget()
        if self._held_words.pending:
            self._start_task(self._answer_held(), f"held-words-{self.id}")

    # --- transcription ------------------------------------------------------------------------

    def _begin_utterance(self) -> None:
        self._partials.new_utterance()
        self._partials.cancel()
        self._pauses.drop_early()
        self._turns.drop()
        self._partials.promises.forget()

    def current_audio(self) -> AudioArray:
        """The audio of the utterance in progress (what a partial decodes)."""
        return self.recorded_audio() if not self.options.server_vad else self._segmenter.current_audio()

    def current_samples(self) -> int:
        """How long ``current_audio`` is, without joining it."""
        return self._recorded.samples if not self.options.server_vad else self._segmenter.current_samples()

    def _ensure_partials(self) -> None:
        # (with turn_prefill_decodes, for the question's prefill alone when the client wants none: none is sent)
        for_prefill = self.settings.turn_prefill_decodes is not False and self._question_prefiller is not None
        wanted = self.options.partials or (self.options.server_vad and for_prefill)
        # (Not for a deferred suspect start: nothing is said of it until it pauses the answer.)
        if wanted and self._pauses.early is None and not self._closed and self._barge_in.deferred_start is None:
            self._partials.start()

    def decode_for_prefill(self) -> bool:
        """Whether a partial decode that only the question's prefill wants (the client asked for no
        partials) runs now: ``turn_prefill_decodes`` true, or auto while the ASR has no other job and
        no other stream is in speech (their decodes and finals come first on the shared cores)."""
        mode = self.settings.turn_prefill_decodes
        if mode != "auto":
            return bool(mode)
        return self.asr.open_jobs() == 0 and not self.asr.others_in_speech(self)

    @property
    def _question_prefiller(self) -> QuestionPrefiller | None:
        """The voice loop's assistant, when it prefills each question as it is spoken (``turn_prefill_partials``)."""
        assistant = self.assistant
        return assistant if self.settings.turn_prefill_partials and isinstance(assistant, QuestionPrefiller) else None

    async def _advance_partial(self, hypothesis: str, audio_samples: int | None = None) -> None:
        await self._partials.advance(hypothesis, audio_samples)

    def heard_so_far(self, words: str) -> None:
        """A partial decode of the utterance in progress reads ``words`` (the promised text and the
        rest): the voice loop's LLM may read the question before it ends (``turn_prefill_partials``)."""
        prefiller = self._question_prefiller
        if prefiller is not None:
            prefiller.prefill_question(words)

    async def _submit_final(
        self,
        audio: AudioArray,
        start_ms: int,
        end_ms: int,
        *,
        early: EarlyFinal | None = None,
        held: Hold | None,
        silence_ms: int = 0,
    ) -> None:
        """Start a final without blocking the audio path (``Finals.submit``); finals of a session
        arrive in order. With ``early``, the final decoded during the trailing silence is this
        utterance's; ``held``: the answer is paused until its words are in (``EchoCheck``).
        ``silence_ms``: the silence the utterance ends with, so its speech ended that long ago."""
        committed = self._partials.promises.committed
        ended_at, spoke_until = time.monotonic(), speech_ended_at(silence_ms)
        self._partials.cancel()
        self._partials.promises.forget()

        who = self._identify(audio)  # beside the transcription, not after the finals before it

        async def send(transcription: asyncio.Task[Transcript]) -> None:
            await self._final(
                audio,
                start_ms,
                end_ms,
                committed=committed,
                ended_at=ended_at,
                spoke_until=spoke_until,
                early=transcription,
                who=who,
                held=held,
            )

        await self._finals.submit(audio, start_ms, end_ms, early, send)

    def _identify(self, audio: AudioArray) -> asyncio.Task[SpeakerMatch | None] | None:
        """Who spoke ``audio``, as a task of this session; None when nobody is enrolled."""
        speakers = self.speakers
        if speakers is None or not speaker.wanted(speakers):
            return None
        return self._start_task(speaker.identify(speakers, audio), f"speaker-{self.id}")

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
        spoke_until: float | None = None,
        early: asyncio.Task[Transcript] | None = None,
        who: asyncio.Task[SpeakerMatch | None] | None = None,
        held: Hold | None = None,
    ) -> FinalTranscript:
        """Transcribe an utterance (``Finals.transcribe``: ``early`` is its transcription already
        under way), join it to what partials promised (``committed``), send it and answer it;
        ``ended_at`` is when the utterance ended (monotonic: ``latency_ms`` counts from there),
        ``spoke_until`` when its speech did (the voice latency's zero; default ``ended_at``).
        ``held``: it started while the answer played, which is paused until its words say whether
        they are the answer's echo (then it is sent marked ``echo`` and not answered)."""
        ended_at = time.monotonic() if ended_at is None else ended_at
        spoke_until = ended_at if spoke_until is None else spoke_until
        committed = self._partials.promises.committed if committed is None else committed
        self._partials.cancel()
        who = who or self._identify(audio)
        try:
            transcript = await self._finals.transcribe(audio, start_ms, end_ms, early)
        except BaseException as exc:
            if who is not None:
                who.cancel()
            if isinstance(exc, Exception):
                await self._answer_held(inside_final=True)  # this utterance brings no words: the held ones go on
            raise
        match = await who if who is not None else None
        delta = continuation(committed, transcript.text)
        text = (committed + delta) if committed else delta
        if text != transcript.text:
            transcript = replace(transcript, text=text)
        self.utterances += 1
        no_speech = max((s.no_speech_prob for s in transcript.segments if s.no_speech_prob is not None), default=None)
        echo = held is not None and await self._barge_in.check.decide(self.assistant, text, held, no_speech)
        latency_ms = (time.monotonic() - ended_at) * 1000.0
        final = FinalTranscript(transcript, delta, start_ms, end_ms, latency_ms, match, echo=echo)
        if committed == self._partials.promises.committed:
            self._partials.promises.forget()
        await self._emit(final)
        if self.assistant is not None and text.strip() and not self._closed and not echo:
            self.assistant.observe_transcript(time.monotonic() - spoke_until)
            speaker_name = match.name if match is not None else None
            hold = self._user_went_on(inside_final=True)
            await self._held_words.answer(
                self.assistant, text, spoke_until, speaker_name, identified=match is not None, hold=hold
            )
        elif self.assistant is not None:
            await self._answer_held(inside_final=True)  # the utterance after held words brought none of its own
        return final

    def _user_went_on(self, *, inside_final: bool = False) -> bool:
        """The user has said more since (an utterance under way, or another final on its way): an
        answer started now would play over them, or be cut by their next final. ``inside_final``:
        asked while a final is being sent (it counts among the pending ones)."""
        if not (self.barge_in and self.options.server_vad):
            return False
        return self._segmenter.in_speech or self._finals.pending > (1 if inside_final else 0)

    async def _answer_held(self, *, inside_final: bool = False) -> None:
        """The utterance after held words ended with none of its own (discarded, silent, failed, the
        answer's echo, or dropped by ``clear``): the held words are answered on their own."""
        if self.assistant is not None and not self._closed and not self._user_went_on(inside_final=inside_final):
            await self._held_words.release(self.assistant)

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.asr.streams.discard(self)
        self._partials.cancel()
        self._pauses.drop_early()
        self._turns.drop()
        self._gaps.cancel()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
