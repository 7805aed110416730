"""A session's barge-in: the user speaking over the answer (``StreamSession``'s side of it).

Speech starting while the voice loop's answer plays cuts it, or pauses it while the utterance's
words decide whether it was the answer's own echo (``EchoCheck``, echo_check.py). Three things live
here, out of the session core:

- a **deferred** start (``EchoCheck.defers``: a suspect start at a playback restart, where the
  canceller lets a syllable through; with ``assistant_barge_in_echo_duck_db``, any suspect start,
  and with ``assistant_barge_in_echo_duck_starts`` ``all`` any start where the echo is cancelled,
  one not suspect then waiting for its voice to outlast its duck's reach: ``reached``)
  says nothing to the client until it is long enough to be kept (``undefer``), the answer playing on
  (that much quieter, with the setting); one that comes to nothing was never heard;
- while an utterance holds the paused answer (``waits``), it ends at silence detection's hangover,
  not the turn model's cap: the session's ``on_wait_change`` re-applies its turn mode;
- the hold of an utterance that ended (``ended``), with what the stream's echo canceller took out of
  it (the word check's residual rule) and the share of it that was the canceller's residual echo.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import replace
from typing import Any

from mediaserver.audio.segmenter import SpeechStart
from mediaserver.config import Settings
from mediaserver.stream.answering import Answerer
from mediaserver.stream.echo_attach import SessionEcho
from mediaserver.stream.echo_check import EchoCheck, Hold, Pausable

log = logging.getLogger(__name__)


class BargeIn:
    """One session's barge-in state: its ``EchoCheck``, a deferred start, and whether the utterance
    in progress holds the paused answer."""

    def __init__(
        self,
        session_id: str,
        settings: Settings,
        start_task: Callable[[Coroutine[Any, Any, None], str], asyncio.Task[None]],
        on_wait_change: Callable[[], None],
    ) -> None:
        self.session_id = session_id
        self.enabled = settings.assistant_barge_in
        self.check = EchoCheck(settings, start_task)  # a barge-in's words decide whether it is the answer's echo
        self.deferred_start: int | None = None  # a start not yet long enough to pause or cut the answer: its ms
        self._deferred_suspect = True  # ... and whether it was a suspect one (pauses) or not (cuts)
        # ... and, for one not suspect that ducked the answer, the stream ms its voice must reach before it
        # cuts the answer (``assistant_barge_in_echo_duck_reach_ms``: its duck heard at the microphone)
        self._reach_at: int | None = None
        self.reach_ms = settings.assistant_barge_in_echo_duck_reach_ms
        self.answer_waits = False  # the utterance in progress holds the paused answer
        self._ducked = False  # the answer plays quieter while the deferred start waits
        self._unducked_at: float | None = None  # (monotonic) when the last duck ended: logged with the next
        self._on_wait_change = on_wait_change

    async def started(
        self, assistant: Answerer | None, start: SpeechStart, *, cancelled: bool, position_ms: int
    ) -> bool:
        """Speech started: cut the answer, pause it (its words will decide) or, for a start
        ``EchoCheck.defers``, do nothing yet; False then (the start is not told to the client).
        ``cancelled``: the server cancels this stream's echo (``SessionEcho.cancelling``);
        ``position_ms``: the stream's clock where the start was heard."""
        if assistant is None or not self.enabled:
            self.waits(False)
            return True
        if self.check.defers(assistant, start, cancelled=cancelled):
            self.deferred_start = start.start_ms  # it speaks once it is long enough
            self._deferred_suspect = start.suspect
            ducks = self.check.ducks(start)
            self._reach_at = position_ms + self.reach_ms if ducks and not start.suspect and self.reach_ms else None
            if ducks:
                last = self._unducked_at
                since = "" if last is None else f", {time.monotonic() - last:.2f} s after the last duck ended"
                log.info(
                    "session %s: %s over the answer at %d ms%s%s: %g dB quieter until it is long enough",
                    self.session_id,
                    "a suspect start" if start.suspect else "a start (not suspect)",
                    start.start_ms,
                    " (at a playback restart)" if start.restart else "",
                    since,
                    self.check.duck_db,
                )
                self._duck(assistant, self.check.duck_db)
            return False
        pausing = self.check.hold(assistant, start.suspect, cancelled=cancelled)
        if not pausing:
            # The user talks over the answer: stop it first. (Logged where its audio was playing: the
            # cuts the word check does not decide were otherwise seen only as "turn interrupted".)
            speaking = isinstance(assistant, Pausable) and assistant.speaking
            if await assistant.interrupt() and speaking:
                log.info("session %s: speech started over the answer at %d ms: cut", self.session_id, start.start_ms)
        self.waits(pausing)
        return True

    def reached(self, voiced_to_ms: int) -> bool:
        """Whether the deferred start, long enough, may be decided now, its voice having gone on to
        ``voiced_to_ms``: one not suspect that ducked the answer only once that is past its duck's
        reach (``assistant_barge_in_echo_duck_reach_ms``)."""
        return self._reach_at is None or voiced_to_ms >= self._reach_at

    async def undefer(
        self, assistant: Answerer | None, *, cancelled: bool, voiced_to_ms: int | None = None
    ) -> int | None:
        """A deferred start long enough to be kept: it pauses the answer now, and its words decide
        (one not suspect cuts it); its start ms (to tell the client), or None when no start was
        deferred. ``voiced_to_ms``: where its voice ended (the utterance ended): one not suspect
        whose voice ended before its duck could be heard (``reached``) pauses the answer as a
        suspect one does: the echo goes quiet with the duck, a person would have talked on."""
        start_ms, self.deferred_start = self.deferred_start, None
        if start_ms is None:
            return None
        self._unduck(assistant)
        suspect = self._deferred_suspect
        if not suspect and voiced_to_ms is not None and not self.reached(voiced_to_ms):
            suspect = True
            log.info(
                "session %s: the start (not suspect) over the answer at %d ms went quiet before its duck could be "
                "heard: taken as suspect",
                self.session_id,
                start_ms,
            )
        self._reach_at = None
        pausing = assistant is not None and self.check.hold(assistant, suspect, cancelled=cancelled)
        if assistant is not None and not pausing:
            # (A start that was not suspect cuts the answer now; a suspect one only where the answer
            # ended or was cut meanwhile: as any start.)
            speaking = isinstance(assistant, Pausable) and assistant.speaking
            if await assistant.interrupt() and speaking:
                log.info("session %s: speech started over the answer at %d ms: cut", self.session_id, start_ms)
        self.waits(pausing)
        return start_ms

    def discarded(self, assistant: Answerer | None) -> bool:
        """The utterance in progress was discarded (too short, noise): True when the client was told
        of its start (a deferred one came to nothing: the answer played on, and nothing was said)."""
        self.waits(False)
        if self.deferred_start is not None:
            log.info("session %s: the start over the answer came to nothing: played on", self.session_id)
            self.deferred_start = None
            self._unduck(assistant)
            return False
        self.check.discarded(assistant)
        return True

    def cleared(self, assistant: Answerer | None) -> None:
        """The transport dropped the utterance in progress: an answer paused for it goes on."""
        if self.deferred_start is not None:
            self.deferred_start = None
            self._unduck(assistant)
        self.waits(False)
        self.check.discarded(assistant)

    def ended(self, echo: SessionEcho, position_ms: int, start_ms: int, end_ms: int) -> Hold | None:
        """The utterance that just ended (``start_ms``-``end_ms``, the stream now at ``position_ms``):
        its hold, if the answer waits on it, with what the stream's echo canceller took out of it
        and the share of it that was its residual echo (None: no canceller, no speech gate)."""
        held = self.check.ended()
        if held is None or echo.removed is None:
            return held
        span = (position_ms - start_ms, position_ms - end_ms)
        share = echo.residual_share(*span) if echo.residual_share is not None else None
        return replace(held, removed_db=echo.removed(*span), residual_share=share)

    def _duck(self, assistant: Answerer | None, db: float) -> None:
        """The answer plays on ``db`` dB quieter while a deferred start waits."""
        if isinstance(assistant, Pausable):
            assistant.duck(db)
            self._ducked = True

    def _unduck(self, assistant: Answerer | None) -> None:
        """The deferred start was decided: the answer plays as written again."""
        if self._ducked and isinstance(assistant, Pausable):
            assistant.duck(0.0)
            self._unducked_at = time.monotonic()
        self._ducked = False

    def waits(self, waits: bool) -> None:
        """The utterance in progress holds the paused answer (or no longer does): how it ends."""
        if waits != self.answer_waits:
            self.answer_waits = waits
            self._on_wait_change()
