"""The turn check of a stream: semantic end of turn on the pauses of a server-VAD utterance.

With semantic turns (``turn_detection`` "semantic", or "auto" on a stream the server answers, and
the turn model loaded), the segmenter's
hangover becomes the eagerness cap, the longest an unfinished turn is waited for
(``turn_wait_{low,medium,high}_ms``). Each pause is judged on three pieces of evidence by the rule
of turns/decision.py: the turn model's score (Smart Turn, turns/model.py) at
``turn_candidate_silence_ms`` and every ``turn_rescore_ms`` of further silence, the words of the
final decoded from the pause's first ``turn_final_silence_ms``, and the length of the silence (a
pause after a finished sentence's words ends at ``turn_finished_silence_ms`` whatever the model
scores; a pause the model failed on ends as silence detection would), and with ``turn_text_model``
"llm" the words' score by the LLM engine (turns/text_eou.py; a low one vetoes the pause's end until
``turn_text_hold_ms``). ``TurnChecks`` holds that
evidence for the pause under way and the one check running; ``Pauses`` (pauses.py) runs
the check as a task of its session and ends the utterance on a finished turn.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, replace
from typing import Literal

from mediaserver.audio.segmenter import SegmenterConfig
from mediaserver.config import Settings
from mediaserver.events import AudioArray
from mediaserver.metrics import Metrics
from mediaserver.turns.decision import TurnRule, Words
from mediaserver.turns.model import TurnModel, mode_for
from mediaserver.turns.text_eou import TextEou

log = logging.getLogger(__name__)


@dataclass
class _TurnCheck:
    """A pause being scored by the turn model; ``silence_from_ms`` is the stream time the pause began."""

    task: asyncio.Task[None]
    silence_from_ms: int
    silence_ms: int  # how long the pause was when it was scored
    held: bool = False  # the stream's audio was held for it once (``settled``)


@dataclass(frozen=True)
class TurnScore:
    """The turn model's score of a pause, ``silence_ms`` into it, and what it cost."""

    probability: float
    decision_ms: float
    first: bool  # the pause's first check (turn_threshold), else a rescore (turn_rescore_threshold)


@dataclass
class _Pause:
    """The evidence gathered on the pause under way (it began at stream time ``from_ms``)."""

    from_ms: int
    words: Words = Words.UNKNOWN
    model_failed: bool = False
    probability: float | None = None  # the last score
    model_agreed: bool = False  # the last score ended the turn, once the pause is long enough (rule 2)
    scored: int = 0  # the turn model's scores of this pause so far (the first is judged on turn_threshold)
    text: asyncio.Task[float | None] | None = None  # the words' text score (turn_text_model)
    text_held: bool = False  # the stream's audio was held for it once (``text_settled``)

    def forget(self) -> None:
        if self.text is not None and not self.text.done():
            self.text.cancel()


class TurnChecks:
    """The turn model's checks of one stream's pauses: which pause is scored (and scored again), the
    threshold a score must reach, and the one check under way."""

    def __init__(
        self,
        model: TurnModel | None,
        settings: Settings,
        metrics: Metrics,
        session_id: str,
        text: TextEou | None = None,
    ) -> None:
        self.model = model
        self.text = text if text is not None and text.in_force else None
        self._text_failed = False  # a failed text score was logged (once per session)
        self.settings = settings
        self.metrics = metrics
        self.session_id = session_id
        self.rule = TurnRule.of(settings)
        self._check: _TurnCheck | None = None
        self._pause: _Pause | None = None

    def wanted(
        self, turn_detection: Literal["silence", "semantic"] | None, *, answering: bool
    ) -> Literal["silence", "semantic"]:
        """The turn mode a stream asks for: its own, else the ``turn_detection`` setting, whose
        ``auto`` means semantic for a stream the server answers (the voice loop), else silence."""
        return mode_for(turn_detection or self.settings.turn_detection, answering=answering)

    def semantic(
        self, turn_detection: Literal["silence", "semantic"] | None, server_vad: bool, *, answering: bool
    ) -> bool:
        """Whether the turn model ends a stream's utterances (asked for, and the model is loaded)."""
        wanted = self.wanted(turn_detection, answering=answering)
        return wanted == "semantic" and server_vad and self.model is not None

    def described(
        self,
        turn_detection: Literal["silence", "semantic"] | None,
        eagerness: Literal["low", "medium", "high", "auto"] | None,
        server_vad: bool,
        *,
        answering: bool,
        hangover_ms: int,
    ) -> dict[str, str]:
        """How a stream's utterances end, as its session events report it: ``turn_detection`` in
        force (``semantic`` or ``silence``), the ``eagerness`` of semantic turns, and
        ``turn_detection_fallback`` saying why a stream that wants semantic turns has silence
        (``hangover_ms``: silence detection's)."""
        if not server_vad:
            return {}
        if self.semantic(turn_detection, server_vad, answering=answering):
            return {"turn_detection": "semantic", "eagerness": eagerness or self.settings.turn_eagerness}
        described = {"turn_detection": "silence"}
        if self.wanted(turn_detection, answering=answering) == "semantic":
            described["turn_detection_fallback"] = (
                f"the turn model is not loaded: utterances end after {hangover_ms} ms of silence"
            )
        return described

    def segmenter_config(
        self,
        silence: SegmenterConfig,
        eagerness: Literal["low", "medium", "high", "auto"] | None,
        *,
        semantic: bool,
        answer_waits: bool,
    ) -> SegmenterConfig:
        """How a stream's segmenter ends utterances in its turn mode (``silence``: silence detection's).

        Semantic turns: the segmenter's hangover becomes the eagerness cap (the longest an unfinished
        turn is waited for); the turn model ends finished turns at their first pause. A burst too
        short to keep is no turn: it is discarded at silence detection's hangover.

        Not for an utterance the paused answer waits on (``answer_waits``, ``EchoCheck.hold``): it
        ends at silence detection's hangover. An echoed fragment is cut mid-sentence by the pause, so
        its words read unfinished and the cap held it (a device trial: 4 s of silence in the answer,
        then the decode, past ``assistant_barge_in_echo_wait_ms``, and the answer was cut); and while
        it is still a burst too short to keep, it ends at ``assistant_barge_in_echo_burst_ms`` of
        silence, so the answer resumes sooner after a leak."""
        if semantic and not answer_waits:
            cap_ms = self.wait_ms(eagerness)
            return replace(silence, hangover_ms=cap_ms, burst_hangover_ms=silence.hangover_ms)
        burst_ms = self.settings.assistant_barge_in_echo_burst_ms
        if answer_waits and burst_ms > 0:
            return replace(silence, burst_hangover_ms=min(silence.hangover_ms, burst_ms))
        return silence

    def wait_ms(self, eagerness: Literal["low", "medium", "high", "auto"] | None) -> int:
        """The eagerness cap: the longest an unfinished turn is waited for (the segmenter's hangover)."""
        eagerness = eagerness or self.settings.turn_eagerness
        return {
            "low": self.settings.turn_wait_low_ms,
            "high": self.settings.turn_wait_high_ms,
        }.get(eagerness, self.settings.turn_wait_medium_ms)

    def follow(self, *, in_speech: bool, position_ms: int, silence_ms: int, semantic: bool) -> bool:
        """Follow the trailing silence: drop the check of a pause that is over (the speech resumed or
        ended); True when this pause is due to be scored (first, or again with more silence)."""
        check = self._check
        if check is not None and (not in_speech or position_ms - silence_ms != check.silence_from_ms):
            self.drop()
        if self._pause is not None and (not in_speech or position_ms - silence_ms != self._pause.from_ms):
            self._forget_pause()
        if not (semantic and in_speech and silence_ms >= self.settings.turn_candidate_silence_ms):
            return False
        check = self._check
        rescore_ms = self.settings.turn_rescore_ms
        # Scored unfinished: score again with more silence.
        return check is None or (rescore_ms > 0 and check.task.done() and silence_ms >= check.silence_ms + rescore_ms)

    def started(self, task: asyncio.Task[None], silence_from_ms: int, silence_ms: int) -> None:
        """``task`` scores the pause that began at stream time ``silence_from_ms``, ``silence_ms`` long."""
        self._check = _TurnCheck(task, silence_from_ms, silence_ms)

    async def settled(self) -> None:
        """Wait for the check under way, at most ``turn_decision_hold_ms`` once per check: the stream's
        audio is held meanwhile, so a pause is judged at the same stream time whether the audio
        comes in real time or faster (a file streamed at full speed is cut as it would be live)."""
        check = self._check
        if check is None or check.task.done() or check.held or self.settings.turn_decision_hold_ms <= 0:
            return
        check.held = True
        await self.decided()

    async def decided(self) -> None:
        """Until the check under way (if any) has decided, at most ``turn_decision_hold_ms``: what it
        ends is sent by then (the device socket's ``ping`` is a barrier for ``speech_stopped``)."""
        check = self._check
        hold_ms = self.settings.turn_decision_hold_ms
        if check is None or check.task.done() or hold_ms <= 0 or check.task is asyncio.current_task():
            return
        await asyncio.wait({check.task}, timeout=hold_ms / 1000.0)

    def drop(self) -> None:
        """Forget the check under way, cancelling it (unless it is the task calling), and the pause's evidence."""
        check, self._check = self._check, None
        self._forget_pause()
        if check is not None and check.task is not asyncio.current_task():
            check.task.cancel()

    def _forget_pause(self) -> None:
        pause, self._pause = self._pause, None
        if pause is not None:
            pause.forget()

    def _pause_from(self, from_ms: int) -> _Pause:
        if self._pause is None or self._pause.from_ms != from_ms:
            self._forget_pause()
            self._pause = _Pause(from_ms)
        return self._pause

    def heard(self, from_ms: int, text: str) -> Words:
        """The words of the pause that began at ``from_ms`` were decoded: what they say of the turn
        (and, with the text model, their text score starts)."""
        words = self.rule.words(text)
        pause = self._pause_from(from_ms)
        pause.words = words
        if self.text is not None and pause.text is None and self.rule.text_scores(text):
            pause.text = asyncio.get_running_loop().create_task(
                self._score_text(self.text, text), name=f"text-eou-{self.session_id}"
            )
        return words

    async def _score_text(self, scorer: TextEou, text: str) -> float | None:
        """The words' text score, or None (no text evidence) if the engine cannot give it in time."""
        started = time.monotonic()
        try:
            async with asyncio.timeout(scorer.timeout_s):
                probability = await scorer.probability(text)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.metrics.turn_text_failures.inc()
            if not self._text_failed:
                self._text_failed = True
                log.warning(
                    "session %s: no text score (%s); its pauses are judged without the text while this lasts",
                    self.session_id,
                    str(exc) or type(exc).__name__,
                )
            return None
        seconds = time.monotonic() - started
        self.metrics.turn_text_seconds.observe(seconds)
        log.debug("session %s: text %.4f for %r (%.0f ms)", self.session_id, probability, text[-40:], seconds * 1000)
        return probability

    def text_of(self, from_ms: int) -> float | None:
        """The text score of the pause that began at ``from_ms``, if it has one by now."""
        pause = self._pause
        if pause is None or pause.from_ms != from_ms or pause.text is None or not pause.text.done():
            return None
        return None if pause.text.cancelled() else pause.text.result()

    def text_vetoes(self, from_ms: int) -> bool:
        return self.rule.text_vetoes(self.text_of(from_ms))

    async def text_score(self, from_ms: int) -> float | None:
        """Wait for the text score of the pause that began at ``from_ms`` (bounded by the scoring's
        own timeout); None without one."""
        pause = self._pause
        if pause is None or pause.from_ms != from_ms or pause.text is None:
            return None
        await asyncio.wait({pause.text})
        return self.text_of(from_ms)

    async def text_settled(self, silence_ms: int) -> None:
        """Once the pause is long enough to be judged (``silence_ms`` so far), wait for its text score
        once (as for its words): the stream's audio is held meanwhile, so the text is evidence at the
        same stream time however fast the audio comes. Bounded by the scoring's own timeout."""
        pause = self._pause
        if pause is None or pause.text is None or pause.text.done() or pause.text_held:
            return
        if silence_ms < self.settings.turn_candidate_silence_ms:
            return
        pause.text_held = True
        await asyncio.wait({pause.text})

    def silence_ends_ms(self, from_ms: int) -> int | None:
        """The length at which the pause that began at ``from_ms`` ends the turn whatever the model
        scores (a finished sentence's words, or a model that failed on it), or None."""
        pause = self._pause
        if pause is None or pause.from_ms != from_ms:
            return None
        return self.rule.silence_ends_ms(
            pause.words, model_failed=pause.model_failed, text=self.text_of(from_ms), model_agreed=pause.model_agreed
        )

    def agreed(self, from_ms: int, complete: bool) -> None:
        """The last score of the pause that began at ``from_ms`` ends the turn (``complete``) once the
        pause is ``TurnRule.model_end_silence_ms`` long, or (a rescore below its threshold) no longer."""
        self._pause_from(from_ms).model_agreed = complete

    def model_agreed(self, from_ms: int) -> bool:
        pause = self._pause
        return pause is not None and pause.from_ms == from_ms and pause.model_agreed

    def model_failed(self, from_ms: int) -> bool:
        pause = self._pause
        return pause is not None and pause.from_ms == from_ms and pause.model_failed

    def last_probability(self, from_ms: int) -> float | None:
        pause = self._pause
        return pause.probability if pause is not None and pause.from_ms == from_ms else None

    async def score(self, audio: AudioArray, silence_ms: int, from_ms: int) -> TurnScore | None:
        """Score the utterance so far, ``silence_ms`` into the pause that began at ``from_ms``; None
        if the model failed (that pause then ends as silence detection would: ``silence_ends_ms``)."""
        model = self.model
        assert model is not None
        started = time.monotonic()
        try:
            score = await model.score(audio)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("session %s: the turn model failed; this pause ends on silence", self.session_id)
            self.metrics.turn_model_failures.inc()
            self._pause_from(from_ms).model_failed = True
            return None
        decision_ms = (time.monotonic() - started) * 1000.0
        pause = self._pause_from(from_ms)
        pause.probability = score.probability
        # The pause's first score, however long the pause had grown by then (a large piece of audio,
        # turn_rescore_ms 0): counted, not read off the silence.
        first, pause.scored = pause.scored == 0, pause.scored + 1
        self.metrics.turn_decision_seconds.labels(
            "complete" if self.rule.model_ends(score.probability, Words.OPEN, first=first) else "incomplete"
        ).observe(decision_ms / 1000.0)
        self.metrics.turn_batch_size.observe(score.batch)
        return TurnScore(score.probability, decision_ms, first)

    def model_ends(self, score: TurnScore, words: Words, text: float | None = None) -> bool:
        return self.rule.model_ends(score.probability, words, first=score.first, text=text)
