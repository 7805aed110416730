"""The second line of defence against self-interruption (issue #37): a barge-in whose words are the
answer's own is the answer's echo, not the user.

A device without acoustic echo cancellation hears the answer it plays; the server's canceller
(audio/echo.py) lets the first second of it through while it converges. So while the assistant
speaks, speech starting does not cut the answer at once: it **pauses** it (``Pausable.pause``: no
more audio goes out, what is queued stays), which the user hears as the answer stopping, as fast as
a cut, and which also stops the echo, so an echoed fragment ends soon. The utterance's final
transcript then decides (``EchoCheck.decide``):

- its words (lowercase, no punctuation) are, ``assistant_barge_in_echo_match`` of them or more,
  words of what the turn has played so far (the sentences whose audio has started to go out): it is
  the answer's echo. It is not a user turn (it is not answered; its final says ``echo``) and the
  answer resumes where it paused;
- where the stream runs the server's echo canceller (audio/echo.py), its words are not the answer's
  but Whisper scores them ``assistant_barge_in_echo_no_speech`` (0.65) or more likely to be no speech
  (its stock phrase on the canceller's residual: "Thank you."): treated as the echo, the check on or
  off (a suspect start's too);
- where the stream runs the server's echo canceller, its words are not the answer's but
  ``assistant_barge_in_echo_residual_share`` (0.6) or more of its voiced frames were the canceller's
  residual echo (its output correlating with the answer audio: ``SpeechGate.residual_share``, what
  AEC3 lets through after the echo's delay jumps): treated as the echo, the check on or off;
- where the stream runs the server's echo canceller, its words are not the answer's
  but the canceller took ``assistant_barge_in_echo_removed_db`` or more out of it (the median over
  its frames with sound): it is what the canceller left of the echo, on which Whisper writes a stock
  phrase ("Thank you."); treated as the echo. A person's speech goes on once the answer pauses and
  the echo dies away, so most of its frames come out whole. (Not for speech after the answer ended:
  a quick reply then overlaps the echo's tail, so the words alone decide there);
- it has no words (and a discarded segment, noise too short to be speech): the answer resumes
  ``assistant_barge_in_echo_resume_ms`` later, unless speech starts again meanwhile (that utterance
  then decides, the answer still paused: a person who began as a leak's segment ended is heard
  without the answer's echo over them, not buried under the resumed answer as a new suspect). Once
  a pause: if that utterance comes to nothing too, the answer resumes at once;
- otherwise it is a real barge-in: the answer is interrupted as without the check (what was heard is
  what played before the pause) and the utterance is answered as the user's next turn.

With the check off (``assistant_barge_in_echo_check``, the default), ``assistant_barge_in_echo_suspects``
still holds a **suspect** start (``SpeechStart.suspect``: most of its voiced frames are ones the
canceller's speech gate noted as like its leaks, audio/echo.py) this way, its words, Whisper's
no-speech score and its residual echo's share deciding (not what the canceller removed:
``Hold.words_only``); any other start cuts the answer at once. At ``all``, every start over the
answer on a stream the server cancels echo on is held so. With ``assistant_barge_in_echo_duck_db``
(20 dB) a suspect start first waits until it is long enough to be kept (``defers``), the answer
playing on that much quieter: most are leaks too short to be kept, a dip in the answer instead of a
hole.

An answer paused ``assistant_barge_in_echo_wait_ms`` without a decision is interrupted, as without
the check; the utterance's final is then an ordinary user turn. Speech that starts within
``AFTER_ANSWER_S`` of the answer's last audio going out (the device still plays its buffer, the room
still echoes it) has nothing left to pause, but its words are checked all the same against what the
answer played: the answer's echo is not answered.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Final, Protocol, runtime_checkable

from mediaserver.audio.segmenter import SpeechStart
from mediaserver.config import Settings

log = logging.getLogger(__name__)

# After the answer's last audio went out: a device's buffer (ws_answer_lead_ms, 200 ms), the echo's
# delay (up to ~300 ms) and the VAD's onset; speech starting later than this is the user's.
AFTER_ANSWER_S: Final = 1.0
_WORD = re.compile(r"[^\W_]+(?:['’][^\W_]+)*")


def words(text: str) -> list[str]:
    """The words of ``text``: lowercase, punctuation dropped (an apostrophe inside a word is kept)."""
    return [w.replace("’", "'") for w in _WORD.findall(text.casefold())]


def echo_share(heard: str, played: str) -> float | None:
    """The share of ``heard``'s words that are words of ``played``; None when ``heard`` has none.

    An echoed fragment starts and ends where the pause cut it, mid-word ("being her" of "being
    herbivores"): its first and last word also count when they begin or end a played word."""
    said = words(heard)
    if not said:
        return None
    known = set(words(played))

    def played_word(index: int, word: str) -> bool:
        if word in known:
            return True
        edge = index in (0, len(said) - 1) and len(word) >= 2
        return edge and any(w.startswith(word) or w.endswith(word) for w in known)

    return sum(played_word(i, word) for i, word in enumerate(said)) / len(said)


@runtime_checkable
class Pausable(Protocol):
    """An answerer whose answer can be paused and resumed (``mediaserver.assistant.turns.Assistant``)."""

    @property
    def speaking(self) -> bool: ...

    @property
    def paused(self) -> bool: ...

    def pause(self) -> bool: ...

    def resume(self) -> None: ...

    def duck(self, db: float) -> None: ...

    def played_text(self) -> str: ...

    def spoke_within(self, seconds: float) -> bool: ...

    async def interrupt(self) -> bool: ...


@dataclass(frozen=True)
class Hold:
    """An utterance that started while the answer played: the answer waits on its words."""

    pause: int | None  # which pause it belongs to (``EchoCheck._pause``); None: the answer had just ended
    removed_db: float | None = None  # what the stream's echo canceller took out of it (None: no canceller)
    # The share of its voiced frames that were the canceller's residual echo (``SpeechGate.residual_share``).
    residual_share: float | None = None
    # Held as a suspect start (the check itself off): what the canceller removed does not decide.
    words_only: bool = False
    cancelled: bool = False  # the server cancels the stream's echo (``SessionEcho.cancelling``)


class EchoCheck:
    """One session's pauses of the answer and the utterances they wait on."""

    def __init__(
        self, settings: Settings, start_task: Callable[[Coroutine[Any, Any, None], str], asyncio.Task[None]]
    ) -> None:
        self.enabled = settings.assistant_barge_in_echo_check
        self.suspects = settings.assistant_barge_in_echo_suspects
        self.match = settings.assistant_barge_in_echo_match
        self.wait_s = settings.assistant_barge_in_echo_wait_ms / 1000.0
        self.resume_s = settings.assistant_barge_in_echo_resume_ms / 1000.0
        self.defer_restarts = settings.assistant_barge_in_echo_defer_restarts
        self.duck_db = settings.assistant_barge_in_echo_duck_db
        self.duck_all = settings.assistant_barge_in_echo_duck_starts == "all"
        self.removed_db = settings.assistant_barge_in_echo_removed_db
        self.no_speech = settings.assistant_barge_in_echo_no_speech
        self.residual_share = settings.assistant_barge_in_echo_residual_share
        self._start_task = start_task
        self._pause = 0  # the pause under way (counts pauses), with the utterances it waits on
        self._waiting = 0
        self._current: Hold | None = None  # the utterance in progress, when it is held
        self._timer: asyncio.Task[None] | None = None  # the pause's expiry, or its resume when resuming
        self._resuming = False  # the pause's utterances came to nothing: it resumes unless speech starts again
        self._waited = False  # the pause under way has waited so once (a second time it resumes at once)
        self.echoes = 0  # utterances dropped as the answer's echo (this session)

    def defers(self, answerer: object, start: SpeechStart, *, cancelled: bool = False) -> bool:
        """Whether a suspect start (the word check off) waits to pause the answer until it is long
        enough to be kept (``stream_min_speech_ms`` of voice; the session then calls ``hold``): one
        that came just after the device's playback started afresh (``SpeechStart.restart``: a
        sentence after the device ran dry, an answer resumed), where AEC3 lets the first syllable
        through. Pausing on each such leak left a 0.6 s hole every 1-2 s of a long answer on a busy
        machine (a user trial: 61 pauses, 42 s of silence in 111 s of answers; each resume a restart
        that leaked again); they are bursts the segmenter discards, and deferred they pause nothing.
        Other suspect starts pause at once: stopping the echo is what lets a person under a louder
        echo through (test_echo_loop.py's barge-in failed 2 of 5 runs with every suspect start
        deferred, 0 of 4 without). ``assistant_barge_in_echo_defer_restarts``.

        With ``assistant_barge_in_echo_duck_db`` above 0 every suspect start waits so, the answer
        playing on that much quieter meanwhile (``BargeIn.started``; not for one at a restart while
        ``assistant_barge_in_echo_defer_restarts`` is on: ``ducks``): what most of them are, a leak
        too short to be kept, is then a dip in the answer, not a hole in it, and the echo over a
        person is that much weaker until their start pauses it.

        With ``assistant_barge_in_echo_duck_starts`` ``all`` (and the duck on), on a stream the
        server cancels echo on (``cancelled``), a start that is not suspect waits too: a leak as loud
        and as kept as a person cut answers at once, and was then discarded as too short to be
        speech. Once long enough, and still voiced past its duck's reach
        (``assistant_barge_in_echo_duck_reach_ms``: ``BargeIn.reached``), it cuts the answer (``hold``
        says whether it pauses instead); one whose voice ended sooner pauses it as a suspect one."""
        suspect = self.suspects and start.suspect and (self._at_restart(start) or self.duck_db > 0)
        other = not start.suspect and self.duck_all and self.duck_db > 0 and cancelled
        return (
            not self.enabled
            and (suspect or other)
            and isinstance(answerer, Pausable)
            and answerer.speaking
            and not answerer.paused
        )

    def _at_restart(self, start: SpeechStart) -> bool:
        return self.defer_restarts and start.suspect and start.restart

    def ducks(self, start: SpeechStart) -> bool:
        """Whether the answer plays on quieter while a start ``defers`` waits: not for a suspect start
        at a playback restart (``assistant_barge_in_echo_defer_restarts``), which plays on as written.
        Where a duck ends the answer is as loud again at once, and the canceller leaks there as at any
        restart: ducked too, such leaks made a dip of their own some 0.5 s after the last one ended,
        dip after dip (tools/echo_long_answers.py: 21 of 57 dips a session, 17 of them within 1 s
        of the one before)."""
        return self.duck_db > 0 and not self._at_restart(start)

    def hold(self, answerer: object, suspect: bool = False, *, cancelled: bool = False) -> bool:
        """Speech started: pause the answer if one is playing and the check is on, or the start is
        ``suspect`` (``SpeechStart.suspect``) and ``assistant_barge_in_echo_suspects`` is on, or it is
        ``all`` and the server cancels the stream's echo (``cancelled``: a canceller attached, not
        passing a microphone ``auto`` found free of echo); True then, else False (the caller
        interrupts as without the check)."""
        self._current = None
        words_only = not self.enabled
        held = self.enabled or (self.suspects and suspect) or (self.suspects == "all" and cancelled)
        if not held or not isinstance(answerer, Pausable):
            return False
        if (self._waiting or self._resuming) and answerer.paused:
            if self._resuming:  # speech again before the answer resumed: it waits on this one
                log.info("speech started again before the paused answer resumed: its words decide")
                self._arm(answerer)
            self._waiting += 1  # more speech while the answer waits on the first
        elif answerer.pause():
            if words_only and suspect:
                log.info("speech started over the answer on frames like the canceller's leaks: pausing it")
            elif words_only:
                log.info("speech started over the answer (echo cancelled, suspects 'all'): pausing it")
            self._pause += 1
            self._waited = False
            self._waiting = 1
            self._arm(answerer)
        else:
            if answerer.spoke_within(AFTER_ANSWER_S):
                # (Nothing left to pause, but its words are checked.)
                self._current = Hold(None, words_only=words_only, cancelled=cancelled)
            return False
        self._current = Hold(self._pause, words_only=words_only, cancelled=cancelled)
        return True

    def ended(self) -> Hold | None:
        """The utterance in progress ended (its final will be decided): its hold, if it is held."""
        hold, self._current = self._current, None
        return hold

    def discarded(self, answerer: object) -> None:
        """The utterance in progress was discarded (too short, noise): it was not the user."""
        hold = self.ended()
        if hold is not None and isinstance(answerer, Pausable):
            log.info("speech over the answer was discarded (too short to be speech): resuming")
            self._settle(answerer, hold, resume=True, soon=True)

    async def decide(self, answerer: object, text: str, hold: Hold | None, no_speech: float | None = None) -> bool:
        """A held utterance's final is ``text`` (``no_speech``: Whisper's highest ``no_speech_prob``
        over its segments, None where the engine does not say): True when it is the answer's echo
        (the answer resumes; the caller drops the utterance). A real barge-in interrupts the answer here."""
        if hold is None or not isinstance(answerer, Pausable):
            return False
        share = echo_share(text, answerer.played_text())
        if hold.pause is None:  # the answer had just ended: nothing to resume or cut
            return self._is_echo(text, share, hold, no_speech)
        if not self._holds(answerer, hold):
            return False  # the pause already ended (timed out, cut by something else)
        if share is None:
            log.info("speech over the answer had no words: resuming")  # not the user
            self._settle(answerer, hold, resume=True, soon=True)
            return False
        if self._is_echo(text, share, hold, no_speech):
            self._settle(answerer, hold, resume=True)
            return True
        log.info(
            "barge-in %r (%.0f %% of its words played, %s dB removed by the canceller, no_speech_prob %s, "
            "residual echo %s): interrupting",
            text,
            share * 100,
            "no" if hold.removed_db is None else f"{hold.removed_db:.1f}",
            "unknown" if no_speech is None else f"{no_speech:.2f}",
            "unmeasured" if hold.residual_share is None else f"{hold.residual_share:.0%}",
        )
        self._settle(answerer, hold, resume=False)
        await answerer.interrupt()
        return False

    def _is_echo(self, text: str, share: float | None, hold: Hold, no_speech: float | None) -> bool:
        if share is None:
            return False
        if share >= self.match:
            log.info("speech %r is the answer's echo (%.0f %% of its words played): not answered", text, share * 100)
        elif (
            hold.pause is not None
            and hold.cancelled  # a stream the server cancels echo on (not one auto found free of echo)
            and self.no_speech
            and no_speech is not None
            and no_speech >= self.no_speech
        ):
            # Whisper's stock phrase on the canceller's residual ("Thank you.", no_speech_prob 0.64-0.84
            # on a simulated device; a person's words over the echo 0.01-0.60, tools/echo_stock_phrases.py).
            # (Over a paused answer only, as the rule below: a reply right after the answer is the user's.)
            log.info(
                "speech %r is what Whisper writes on no speech (no_speech_prob %.2f) over the paused answer: "
                "the canceller's residual echo, not answered",
                text,
                no_speech,
            )
        elif (
            hold.pause is not None
            and hold.cancelled
            and self.residual_share
            and hold.residual_share is not None
            and hold.residual_share >= self.residual_share
        ):
            # What AEC3 let through after the echo's delay jumped still correlates with the answer audio
            # (leaks Whisper wrote words on: 27 of 32 at 0.6 or more; people's words over the echo at most 0.42,
            # tools/echo_stock_phrases.py). Over a paused answer only, as the rules around it.
            log.info(
                "speech %r was the canceller's residual echo (%.0f %% of its voiced frames correlate with the "
                "answer): not answered",
                text,
                hold.residual_share * 100,
            )
        elif (
            hold.pause is not None
            and not hold.words_only
            and self.removed_db
            and (hold.removed_db or 0.0) >= self.removed_db
        ):
            # (Only over a paused answer: right after an answer, a quick reply overlaps the echo's tail,
            # and the canceller takes much of its start; a leak then is rare, the canceller converged.)
            log.info(
                "speech %r is the canceller's residual echo (it took %.1f dB out of it): not answered",
                text,
                hold.removed_db,
            )
        else:
            return False
        self.echoes += 1
        return True

    def _holds(self, answerer: Pausable, hold: Hold) -> bool:
        return hold.pause == self._pause and self._waiting > 0 and answerer.paused

    def _settle(self, answerer: Pausable, hold: Hold, *, resume: bool, soon: bool = False) -> None:
        """``hold``'s utterance is decided: the answer resumes (``soon``: after ``resume_s``, unless
        speech starts again) or not (it is cut) once no other utterance of the pause is waited on."""
        if not self._holds(answerer, hold):
            return
        self._waiting = 0 if not resume else self._waiting - 1
        if self._waiting:
            return  # another utterance of this pause is still to be decided
        self._disarm()
        if resume and soon and self.resume_s > 0 and not self._waited:
            # (Once a pause: bursts of noise each starting within resume_s of the last would
            # otherwise keep the answer silent without end, each of them a decision.)
            self._resuming = self._waited = True
            self._timer = self._start_task(self._resume_later(answerer, self._pause), "echo-check-resume")
        elif resume:
            answerer.resume()

    def _arm(self, answerer: Pausable) -> None:
        self._disarm()
        self._timer = self._start_task(self._expire(answerer, self._pause), "echo-check")

    def _disarm(self) -> None:
        self._resuming = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    async def _resume_later(self, answerer: Pausable, pause: int) -> None:
        await asyncio.sleep(self.resume_s)
        if pause != self._pause or not self._resuming:
            return
        self._resuming = False
        self._timer = None
        if answerer.paused:  # (not cut meanwhile)
            answerer.resume()

    async def _expire(self, answerer: Pausable, pause: int) -> None:
        await asyncio.sleep(self.wait_s)
        if pause == self._pause and self._waiting and answerer.paused:
            log.info("answer paused %.1f s without a decision: interrupting", self.wait_s)
            self._waiting = 0
            self._timer = None
            await answerer.interrupt()
