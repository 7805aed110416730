"""What the session core asks of the voice loop's assistant, and the finals it holds back from it.

``Answerer`` (and the optional ``SpeakerAware`` / ``Speculator``) is what ``StreamSession`` needs
of an assistant (``mediaserver.assistant.turns.Assistant``, or a Realtime conversation's turns).

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


@dataclass(frozen=True)
class _Held:
    text: str
    ended_at: float  # when its speech ended (monotonic)
    speaker: str | None  # who said it, when speakers are enrolled


class HeldWords:
    """A session's final not answered yet, because the user had begun the next utterance first."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self._held: _Held | None = None

    @property
    def pending(self) -> bool:
        return self._held is not None

    async def answer(self, answerer: Answerer, text: str, ended_at: float, speaker: str | None, *, hold: bool) -> None:
        """Answer a final, joined to the held words when the same speaker said them (another
        speaker's are answered first, on their own); ``hold``: the user already speaks on, so it
        waits for the next final instead."""
        held, self._held = self._held, None
        if held is not None and held.speaker == speaker:
            text = f"{held.text.rstrip()} {text.lstrip()}"
        elif held is not None:  # someone else's words: answered first, as theirs
            if isinstance(answerer, SpeakerAware):
                answerer.heard_speaker(held.speaker)
            await answerer.answer(held.text, speech_ended_at=held.ended_at)
            if isinstance(answerer, SpeakerAware):
                answerer.heard_speaker(speaker)
        if hold:
            log.info("session %s: the user spoke on before their final was answered: it waits", self.session_id)
            self._held = _Held(text, ended_at, speaker)
            return
        await answerer.answer(text, speech_ended_at=ended_at)

    async def release(self, answerer: Answerer) -> None:
        """The next utterance brought no words: answer the held ones on their own."""
        held, self._held = self._held, None
        if held is not None:
            await answerer.answer(held.text, speech_ended_at=held.ended_at)
