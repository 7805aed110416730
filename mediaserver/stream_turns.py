"""The turn check of a stream: semantic end of turn on the pauses of a server-VAD utterance.

With semantic turns (``turn_detection`` "semantic" and the turn model loaded), the segmenter's
hangover becomes the eagerness cap, the longest an unfinished turn is waited for
(``turn_wait_{low,medium,high}_ms``). A pause of ``turn_candidate_silence_ms`` is scored by the turn
model (Smart Turn, turns/model.py); a score at ``turn_threshold`` ends the turn at once, and a pause
scored unfinished is scored again every ``turn_rescore_ms`` of further silence, against
``turn_rescore_threshold``. ``TurnChecks`` holds that policy and the one check under way;
``StreamSession`` (stream_session.py) runs the check as its task and ends the utterance on a
finished turn.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Literal

from mediaserver.config import Settings
from mediaserver.events import AudioArray
from mediaserver.metrics import Metrics
from mediaserver.turns.model import TurnModel

log = logging.getLogger(__name__)


@dataclass
class _TurnCheck:
    """A pause being scored by the turn model; ``silence_from_ms`` is the stream time the pause began."""

    task: asyncio.Task[None]
    silence_from_ms: int
    silence_ms: int  # how long the pause was when it was scored


@dataclass(frozen=True)
class TurnVerdict:
    """The turn model's decision on a pause: ``complete`` when ``probability`` reached the threshold."""

    complete: bool
    probability: float
    decision_ms: float


class TurnChecks:
    """The turn model's checks of one stream's pauses: which pause is scored (and scored again), the
    threshold a score must reach, and the one check under way."""

    def __init__(self, model: TurnModel | None, settings: Settings, metrics: Metrics, session_id: str) -> None:
        self.model = model
        self.settings = settings
        self.metrics = metrics
        self.session_id = session_id
        self._check: _TurnCheck | None = None

    def semantic(self, turn_detection: Literal["silence", "semantic"] | None, server_vad: bool) -> bool:
        """Whether the turn model ends a stream's utterances (asked for, and the model is loaded)."""
        wanted = turn_detection or self.settings.turn_detection
        return wanted == "semantic" and server_vad and self.model is not None

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
        if not (semantic and in_speech and silence_ms >= self.settings.turn_candidate_silence_ms):
            return False
        check = self._check
        rescore_ms = self.settings.turn_rescore_ms
        # Scored unfinished: score again with more silence.
        return check is None or (rescore_ms > 0 and check.task.done() and silence_ms >= check.silence_ms + rescore_ms)

    def started(self, task: asyncio.Task[None], silence_from_ms: int, silence_ms: int) -> None:
        """``task`` scores the pause that began at stream time ``silence_from_ms``, ``silence_ms`` long."""
        self._check = _TurnCheck(task, silence_from_ms, silence_ms)

    def drop(self) -> None:
        """Forget the check under way, cancelling it (unless it is the task calling)."""
        check, self._check = self._check, None
        if check is not None and check.task is not asyncio.current_task():
            check.task.cancel()

    async def score(self, audio: AudioArray, silence_ms: int) -> TurnVerdict | None:
        """Score the utterance so far, ``silence_ms`` into its pause; None if the model failed (the
        utterance then ends on silence, at the eagerness cap)."""
        model = self.model
        assert model is not None
        started = time.monotonic()
        try:
            score = await model.score(audio)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("session %s: the turn model failed; this utterance ends on silence", self.session_id)
            return None
        decision_ms = (time.monotonic() - started) * 1000.0
        first = silence_ms < self.settings.turn_candidate_silence_ms + max(1, self.settings.turn_rescore_ms)
        threshold = self.settings.turn_threshold if first else self.settings.turn_rescore_threshold
        complete = score.probability >= threshold
        self.metrics.turn_decision_seconds.labels("complete" if complete else "incomplete").observe(
            decision_ms / 1000.0
        )
        self.metrics.turn_batch_size.observe(score.batch)
        return TurnVerdict(complete, score.probability, decision_ms)
