"""The words of a turn: a transcript that ends on a word no sentence ends on is not a finished turn.

Smart Turn is an audio model: it hears intonation first, and a fragment read with a finished
sentence's fall ("Turn on the", "Add milk, eggs, and") scores as finished (0.94-0.98 on Piper's
reading, tools/README.md "bench_turns.py"). The final transcript of the pause is decoded from its
first 30 ms (``turn_final_silence_ms``), so by the time the model answers, the words are known: a
turn whose last word is an article, a possessive or a coordinating conjunction
(``turn_unfinished_words``) waits for the speech to resume, or for the eagerness cap. Only words that
(almost) never end an English sentence are listed: "to", "for", "of" or "at" end real questions
("What is it made of?") and are left to the model.
"""

from __future__ import annotations

from collections.abc import Collection

DEFAULT_UNFINISHED_WORDS = ("a", "an", "the", "and", "or", "but", "my", "your", "our", "their")
# Whisper's marks of a phrase that trails off or breaks off: "Feels like these...", "7 of Cl-".
DEFAULT_UNFINISHED_ENDINGS = ("...", "\u2026", "-", ",")
# A pause after a finished sentence's words ends the turn this long into it (turns/decision.py).
FINISHED_SILENCE_MS = 600


def last_word(text: str) -> str:
    """The text's last word, lower case, without punctuation ("" if none)."""
    for token in reversed(text.split()):
        word = "".join(ch for ch in token.lower() if ch.isalnum() or ch == "'")
        if word:
            return word
    return ""


def ends_unfinished(text: str, unfinished_words: Collection[str]) -> bool:
    """Whether ``text`` ends on one of ``unfinished_words`` (compared in lower case)."""
    word = last_word(text)
    return bool(word) and word in {w.lower() for w in unfinished_words}
