"""The first answer to an enrolled speaker says their name (``assistant_greeting``).

The prompt names the person speaking (assistant/turns.py), but whether the answer uses the name is
the language model's: the bundled SmolLM2-135M does in about half its greetings (docs/speakers.md).
So the server makes sure of it, without waiting for more than the answer's first words: they are
held until the first sentence ends (a ``.``, ``?`` or ``!`` and a space) or they are more than
``assistant_first_clause_words`` words (8 when that is 0); if they name the speaker they go out as
written, otherwise the greeting ("Hi Alice.") goes before them. Once per
speaker while they keep talking: another enrolled speaker's turn in between makes the next one a
greeting again; an unknown voice's does not.
"""

from __future__ import annotations

import re

_SENTENCE_END = re.compile(r"[.!?](?:\s|$)")


def names(text: str, name: str) -> bool:
    """Whether ``text`` says ``name`` as a word (any case)."""
    return re.search(rf"(?<!\w){re.escape(name)}(?!\w)", text, re.IGNORECASE) is not None


class Greeting:
    """The deltas of an answer to ``name``: held until its first words tell whether they name the
    speaker, then given back as they are, or after ``template`` (``{name}`` filled in)."""

    def __init__(self, name: str, template: str, words: int) -> None:
        self.name = name
        self.greeting = template.format(name=name)
        self.words = max(words, 1)
        self._held = ""
        self.decided = False
        self.greeted = False  # the server's greeting went before the answer

    def push(self, delta: str) -> str:
        """The text to send on now (empty while the first words are held)."""
        if self.decided:
            return delta
        self._held += delta
        if _SENTENCE_END.search(self._held) is None and len(self._held.split()) <= self.words:
            return ""
        return self._decide()

    def end(self) -> str:
        """The answer ended: what is still held (the greeting before it, unless it named them)."""
        return "" if self.decided else self._decide()

    def _decide(self) -> str:
        self.decided = True
        held, self._held = self._held, ""
        if names(held, self.name) or not held.strip():
            return held
        self.greeted = True
        return f"{self.greeting} {held.lstrip()}"


class Greeted:
    """Whom the voice loop's answers have greeted: an enrolled speaker's next answer greets them
    unless the answer before went to them too; an unknown voice's answer changes nothing."""

    def __init__(self) -> None:
        self.last: str | None = None  # the enrolled speaker the answers last went to

    def due(self, speaker: str | None, template: str) -> str | None:
        """The speaker the next answer greets, if due (``template``: ``assistant_greeting``, empty: off)."""
        if not template or speaker is None or speaker == self.last:
            return None
        return speaker

    def answering(self, speaker: str | None) -> None:
        """An answer to ``speaker`` goes out (a turn started, a speculation released)."""
        if speaker is not None:
            self.last = speaker

    def forget(self) -> None:
        self.last = None
