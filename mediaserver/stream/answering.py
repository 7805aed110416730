"""What the session core asks of the voice loop's assistant, and the finals it holds back from it.

``Answerer`` (and the optional ``SpeakerAware`` / ``Speculator`` / ``QuestionPrefiller``) is what
``StreamSession`` needs of an assistant (``mediaserver.assistant.turns.Assistant``, or a Realtime conversation's turns).

``HeldWords``: semantic turns end a turn at a pause, and the rest of a sentence can begin before
its first half's final is decoded (the pause was shorter than the decode, or the ASR queue is
behind). An answer started on that final would play over the user, and their next final would cut
it. So the session holds such a final instead: the next final is answered together with it, as one
user turn, when the same speaker said both (as the assistant's rejoin does for an answer nobody
heard, assistant/turns.py); if the next utterance brings no words, the held words are answered on
their own when it ends.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

log = logging.getLogger(__name__)


class Answerer(Protocol):
    """What the session needs of a voice-loop assistant (``mediaserver.assistant.turns.Assistant``)."""

    async def answer(self, user_text: str, *, speech_ended_at: float | None = None) -> None: ...

    async def interrupt(self) -> bool: ...

    def observe_transcript(self, seconds: float) -> None: ...


@runtime_checkable
class SpeakerAware(Protocol):
    """An answerer told who speaks each turn it answers (``Assistant``: its prompt names them)."""

    def heard_speaker(self, name: str | None) -> None: ...


@runtime_checkable
class Speculator(Protocol):
    """An answerer that can prepare an answer before the turn has ended (``Assistant``)."""

    def speculate(self, user_text: str, *, speech_ended_at: float | None = None) -> bool: ...

    def drop_speculation(self) -> None: ...


@runtime_checkable
class QuestionPrefiller(Protocol):
    """An answerer that can have its LLM read a question while it is spoken (``Assistant``)."""

    def prefill_question(self, words: str) -> None: ...


@dataclass(frozen=True)
class _Held:
    text: str
    ended_at: float  # when its speech ended (monotonic)
    speaker: str | None  # who said it (None: nobody enrolled matched)
    identified: bool  # speakers are enrolled: the answerer is told who speaks (``SpeakerAware``)


class HeldWords:
    """A session's finals not answered yet, because the user had begun the next utterance first."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self._held: list[_Held] = []  # in order; consecutive words of one speaker are joined

    @property
    def pending(self) -> bool:
        return bool(self._held)

    async def answer(
        self,
        answerer: Answerer,
        text: str,
        ended_at: float,
        speaker: str | None,
        *,
        identified: bool = False,
        hold: bool = False,
    ) -> None:
        """Answer a final with the held words before it (joined to them when the same speaker said
        them); ``identified``: its speaker was looked up (the answerer is told who it is before each
        answer); ``hold``: the user has already said more, so it waits with them instead."""
        last = self._held[-1] if self._held else None
        if last is not None and last.speaker == speaker:
            joined = f"{last.text.rstrip()} {text.lstrip()}"
            self._held[-1] = _Held(joined, ended_at, speaker, last.identified or identified)
        else:
            self._held.append(_Held(text, ended_at, speaker, identified))
        if hold:
            log.info("session %s: the user said more before their final was answered: it waits", self.session_id)
            return
        await self.release(answerer)

    async def release(self, answerer: Answerer) -> None:
        """Answer the held words now. Several speakers' are answered in turn, each as theirs (an
        answer cuts the one before it, so the earlier ones stay questions in the history)."""
        held, self._held = self._held, []
        for words in held:
            if words.identified and isinstance(answerer, SpeakerAware):
                answerer.heard_speaker(words.speaker)  # each answered turn is told its own speaker
            await answerer.answer(words.text, speech_ended_at=words.ended_at)
