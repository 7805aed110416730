"""The pause under way in a server-VAD stream: its early final, its turn check, and what ends it.

While someone speaks, each pause is watched (``watch``, after every piece of audio is segmented):
once it is long enough the final transcription starts early (``stream_final_early_ms`` before
silence detection's hangover, or at ``turn_final_silence_ms`` with semantic turns), so it is ready
when the turn ends; with semantic turns the turn model scores the pause (``TurnChecks``), its words
and their text are weighed by the rule (turns/decision.py), and a finished turn ends the utterance
in its pause (``end_turn_on_silence``, or the model's decision in ``_decide_turn``). Speech
resuming drops the early final (and an answer speculated on it).

Split from ``StreamSession`` (session.py), which owns a ``Pauses`` and tells it when an utterance
begins, ends or is dropped; the session's own state it reads (closed, the assistant, whether its
turns are semantic) comes through ``_Session``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

from mediaserver.audio.segmenter import Discarded, SpeechStart, Utterance, VadSegmenter
from mediaserver.events import AudioArray, SessionEvent, Transcript, TurnDecided
from mediaserver.stream.answering import Answerer, Speculator
from mediaserver.stream.finals import EarlyFinal, Finals, TaskStarter, speech_ended_at
from mediaserver.stream.options import StreamParent
from mediaserver.stream.partials import Partials
from mediaserver.stream.turns import TurnChecks
from mediaserver.turns.decision import Words

log = logging.getLogger(__name__)


class _Session(StreamParent, Protocol):
    """What the pauses read of their session (``StreamSession``): what every part reads, and
    whether it is closed, answered, and in semantic turns."""

    @property
    def closed(self) -> bool: ...

    @property
    def assistant(self) -> Answerer | None: ...

    @property
    def semantic_turns(self) -> bool: ...


class Pauses:
    """The pause under way in one stream (see the module's docstring)."""

    def __init__(
        self,
        session: _Session,
        *,
        segmenter: VadSegmenter,
        turns: TurnChecks,
        partials: Partials,
        finals: Finals,
        emit: Callable[[SessionEvent], Awaitable[None]],
        segment_lock: asyncio.Lock,
        start_task: TaskStarter,
        on_segment: Callable[[SpeechStart | Utterance | Discarded], Awaitable[None]],
    ) -> None:
        self._session = session
        self._segmenter = segmenter
        self._turns = turns
        self._partials = partials
        self._finals = finals
        self._emit = emit
        self._segment_lock = segment_lock  # the session's: events stay in stream order
        self._start_task = start_task
        self._on_segment = on_segment
        self.early: EarlyFinal | None = None  # the final started in this pause, if any

    def watch(self) -> None:
        """Start the final early once the speech has been silent long enough; drop it if speech resumed.

        With semantic turns, a pause of ``turn_candidate_silence_ms`` is also scored by the turn
        model (``_decide_turn``), and the final starts then too: it is decoded while the turn
        model decides, ready when a finished turn ends."""
        early = self.early
        segmenter = self._segmenter
        silence_ms = segmenter.silence_ms
        if early is not None and segmenter.in_speech and early.pause_from_ms != segmenter.position_ms - silence_ms:
            # Voiced again: this silence was a pause, not the end. (Its start tells: speech resuming
            # moves it on, also where it resumed and paused again within one piece of audio, the
            # silence then as long as when the final started.)
            self.drop_early()
            early = None
        semantic = self._session.semantic_turns
        if self._turns.follow(
            in_speech=segmenter.in_speech,
            position_ms=segmenter.position_ms,
            silence_ms=silence_ms,
            semantic=semantic and segmenter.long_enough,  # a shorter burst is no turn (``_end_turn_on_silence``)
        ):
            self._start_turn_check(silence_ms)
        candidate_ms = self._session.settings.turn_candidate_silence_ms
        early_ms = self._session.settings.stream_final_early_ms
        # (With semantic turns the pause's final is the rule's evidence, its words: it starts whatever
        # stream_final_early_ms says; a review found 0 had sent finished sentences to the cap.)
        if (early_ms <= 0 and not semantic) or early is not None or not segmenter.long_enough or self._session.closed:
            return  # (a burst too short to keep is discarded, never decoded)
        config = self._segmenter.config
        if semantic:
            final_ms = self._session.settings.turn_final_silence_ms or candidate_ms
            start_ms = min(final_ms, candidate_ms, config.hangover_ms - early_ms)
        else:
            start_ms = config.hangover_ms - early_ms
        if silence_ms < max(config.frame_ms, start_ms):
            return
        self._partials.cancel()  # the final is about to be decoded: partials only compete with it now
        audio = self._segmenter.current_audio()
        task = self._finals.start(audio, f"early-final-{self._session.id}")
        pause_from_ms = self._segmenter.position_ms - silence_ms
        early = self.early = EarlyFinal(task, audio.size, silence_ms, pause_from_ms, speech_ended_at(silence_ms))
        if semantic:
            task.add_done_callback(lambda done: self._hear_pause(early, pause_from_ms, done))
        if self._session.settings.turn_speculative_answers and isinstance(self._session.assistant, Speculator):
            task.add_done_callback(lambda done: self._speculate(early, done))

    def _speculate(self, early: EarlyFinal, task: asyncio.Task[Transcript]) -> None:
        """The final was decoded while the turn is still open: the voice loop starts its answer now
        (held until the turn ends; dropped if the speech resumes)."""
        if task.cancelled() or task.exception() is not None or self.early is not early or self._session.closed:
            return
        assistant = self._session.assistant
        if not isinstance(assistant, Speculator) or not self._segmenter.in_speech:
            return
        text = self._partials.promises.joined(task.result().text)
        if text.strip():
            assistant.speculate(text, speech_ended_at=early.speech_ended_at)

    def _start_turn_check(self, silence_ms: int) -> None:
        if self._session.closed:
            return
        silence_from_ms = self._segmenter.position_ms - silence_ms
        task = self._start_task(
            self._decide_turn(self._segmenter.current_audio(), silence_ms, silence_from_ms), f"turn-{self._session.id}"
        )
        self._turns.started(task, silence_from_ms, silence_ms)

    async def _decide_turn(self, audio: AudioArray, silence_ms: int, silence_from_ms: int) -> None:
        """Score the pause; the rule (turns/decision.py) weighs the score with the pause's words: a
        finished turn ends the utterance now (if the pause still goes on)."""
        score = await self._turns.score(audio, silence_ms, silence_from_ms)
        if score is None:  # the model failed: this pause ends as silence detection would
            async with self._segment_lock:
                await self.end_turn_on_silence()
            return
        complete, text, words = self._turns.model_ends(score, Words.OPEN), None, Words.UNKNOWN
        if complete:  # the words may veto it: they are needed only then
            words = await self._pause_words(silence_from_ms)
            complete = self._turns.model_ends(score, words)
            if complete:  # and so may the text (turn_text_model): its score is waited for then
                text = await self._turns.text_score(silence_from_ms)
                complete = self._turns.model_ends(score, words, text)
        async with self._segment_lock:
            segmenter = self._segmenter
            if (
                self._session.closed
                or not segmenter.in_speech
                or segmenter.position_ms - segmenter.silence_ms != silence_from_ms
            ):
                return  # the speech went on (or ended on silence) while the model was deciding
            self._turns.agreed(silence_from_ms, complete)
            if complete and segmenter.silence_ms < self._turns.rule.model_end_silence_ms(words):
                # Words without a final mark: the model's 'complete' ends the turn once the pause is
                # turn_open_silence_ms long (``_end_turn_on_silence``), if the speech has not resumed.
                return
            await self._emit(
                TurnDecided(
                    complete,
                    score.probability,
                    score.decision_ms,
                    silence_ms,
                    segmenter.position_ms,
                    text_probability=text if text is not None else self._turns.text_of(silence_from_ms),
                )
            )
            if complete:
                await self._end_turn("model")
            # else keep listening: the speech resumes, the words' silence or the eagerness cap ends the turn

    async def _pause_words(self, silence_from_ms: int) -> Words:
        """What the final decoded in this pause says of the turn (turns/decision.py). It started at
        ``turn_final_silence_ms``, before the turn model was asked, so it is usually ready; waiting
        for it costs the answer nothing (the answer needs it)."""
        early = self.early
        if early is None:
            return Words.UNKNOWN
        try:
            transcript = await asyncio.shield(early.task)
        except Exception:
            return Words.UNKNOWN  # cancelled (the speech resumed) or failed: the final path handles it
        return self._heard(silence_from_ms, transcript)

    def _heard(self, silence_from_ms: int, transcript: Transcript) -> Words:
        text = self._partials.promises.joined(transcript.text)
        words = self._turns.heard(silence_from_ms, text)
        if words is Words.UNFINISHED:
            log.debug("session %s: %r reads unfinished; the turn goes on", self._session.id, text[-40:])
        return words

    async def words_settled(self) -> None:
        """Once a pause is long enough to be judged, wait for its words too (at most
        ``turn_decision_hold_ms``, once per pause), so they are evidence at the same stream time
        however fast the audio comes or however busy the ASR queue is."""
        early, hold_ms = self.early, self._session.settings.turn_decision_hold_ms
        if early is None or early.held or early.task.done() or hold_ms <= 0 or not self._session.semantic_turns:
            return
        if self._segmenter.silence_ms < self._session.settings.turn_candidate_silence_ms:
            return
        early.held = True
        await asyncio.wait({early.task}, timeout=hold_ms / 1000.0)

    def _hear_pause(self, early: EarlyFinal, silence_from_ms: int, task: asyncio.Task[Transcript]) -> None:
        """The pause's final was decoded: its words are evidence for the pause from now on (a
        finished sentence's words end the turn at ``turn_finished_silence_ms``)."""
        if task.cancelled() or task.exception() is not None or self.early is not early or self._session.closed:
            return
        if self._heard(silence_from_ms, task.result()) is Words.UNFINISHED:
            self._session.asr.metrics.turn_unfinished_words.inc()

    async def end_turn_on_silence(self) -> None:
        """End the turn if the pause under way has lasted as long as its evidence allows, whatever
        the turn model scores (``TurnChecks.silence_ends_ms``). Called with the segment lock held."""
        segmenter = self._segmenter
        if (
            self._session.closed
            or not segmenter.in_speech
            or segmenter.silence_ms <= 0
            or not self._session.semantic_turns
        ):
            return
        if not segmenter.long_enough:
            # A burst too short to keep (a word's first syllable, a click) is no turn: nothing ends it
            # here; speech resuming joins it to the utterance (its first word is not cut off), else the
            # segmenter discards it at silence detection's hangover (``StreamSession._apply_turn_mode``).
            return
        silence_from_ms = segmenter.position_ms - segmenter.silence_ms
        ends_ms = self._turns.silence_ends_ms(silence_from_ms)
        if ends_ms is None or segmenter.silence_ms < ends_ms:
            return
        text = self._turns.text_of(silence_from_ms)
        if self._turns.model_failed(silence_from_ms):
            by = "silence"
        elif self._turns.text_vetoes(silence_from_ms):
            by = "text"
        else:
            by = "model" if self._turns.model_agreed(silence_from_ms) else "words"
        probability = self._turns.last_probability(silence_from_ms)
        await self._emit(
            TurnDecided(
                True, probability, 0.0, segmenter.silence_ms, segmenter.position_ms, by=by, text_probability=text
            )
        )
        await self._end_turn(by)

    async def _end_turn(self, by: str) -> None:
        """End the utterance now, in its pause (``by``: what decided it, counted in /metrics)."""
        self._session.asr.metrics.turn_ends.labels(by).inc()
        event = self._segmenter.end_turn()
        if event is not None:
            await self._on_segment(event)

    def drop_early(self) -> None:
        if self.early is not None:
            self.early.task.cancel()
            self.early = None
            if isinstance(self._session.assistant, Speculator):
                self._session.assistant.drop_speculation()  # the speech resumed: an answer started on it is unheard

    def take_early(self, utterance: Utterance) -> EarlyFinal | None:
        """The early final if it is this utterance's (it ended on the silence the final started in)."""
        early, self.early = self.early, None
        if early is None:
            return None
        if early.fits(utterance):
            return early
        early.task.cancel()
        return None
