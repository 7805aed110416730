"""The end-of-turn rule: the turn model's score, the words of the pause and the silence, together.

No one piece of evidence is good enough alone (tools/README.md, "bench_turns.py"):

* **The turn model** (Smart Turn v3.2) hears intonation. It scores most finished sentences high
  after 200 ms, but some real speakers' finished sentences (and Piper's even reading of long ones)
  score below 0.1 ("Feels like these days go on forever." 0.01), and some fragments read with a
  falling pitch score 0.9+ ("Can you tell me").
* **The words** of the pause: the final transcript decoded from the pause's first 30 ms
  (``turn_final_silence_ms``) is ready well before the model's answer. Whisper ends a sentence it
  hears as finished with ``.``, ``?`` or ``!`` and often ends a trailing fragment with ``...`` or a
  dash ("He was not an ill...", "7 of Cl-"). It also writes ``.`` after many fragments ("He might
  even have been."), so a full stop alone cannot end a turn at once.
* **The silence**: the longer it lasts, the likelier the turn is over.
* **The text** (only with ``turn_text_model`` "llm", turns/text_eou.py): a language model's
  probability that the sentence ends after the pause's words. Low, it says the words are a
  fragment ("Remind me to buy" ...) where the turn model and Whisper's full stop are fooled.

The rule, per pause (``decide``), once the utterance has ``stream_min_speech_ms`` of voiced audio
(a shorter burst's pause is not judged: StreamSession joins it to speech resuming within
``stream_vad_hangover_ms``, or discards it then):

1. Words that end on ``turn_unfinished_words`` ("the", "and", "my" ...) or on a trailing mark of an
   unfinished phrase (``turn_unfinished_endings``: "...", "-", ",") keep the turn open whatever the
   model scores; it ends when the speech resumes or at the eagerness cap (with the text, at its hold).
2. Otherwise a model score of at least ``turn_threshold`` at the first check ends the turn, and at
   least ``turn_rescore_threshold`` at a later one (the model grows surer with silence, for
   fragments too); when the words have no final mark (``OPEN``: "10 of", "And Mr. John Dashwood
   had then leisure"), not before the pause is ``turn_open_silence_ms`` long.
3. Words that end as a finished sentence end the turn once the pause reaches
   ``turn_finished_silence_ms``, whatever the model scores: no finished sentence waits for the cap.
4. If the model fails on a pause, that pause ends as silence detection would
   (``stream_vad_hangover_ms``), whatever the words.
5. Otherwise (no words yet, or words with no final mark) the eagerness cap ends the turn.

With the text: words it scores below ``turn_text_threshold`` veto rules 2 and 3 (the model's
'complete' and the finished words' end), and that pause ends once it is ``turn_text_hold_ms`` long
(whatever the words and the model; rule 4 still applies), or when the speech resumes, or at the
cap. So a pause whose words read unfinished (rule 1) and that the text reads as a fragment too ends
at the hold, not the cap. Measured (tools/README.md, bench_turns.py, stop 60): leaving such pauses
to the cap keeps more 1.2 s pauses whole, but a finished real sentence that tiny.en decoded as a
fragment ("He was not an old sp-") then waited the 4 s cap. A text score of at least the
threshold, or none (the text model is off, the engine is unavailable, the score failed or came too
late), changes nothing: rules 1-5 as above. Words that end on ``turn_text_skip_endings``
(Whisper's ``?``) are not scored: the text reads the bare words, without the question mark, and
took misheard or terse questions for fragments ("What colors the sky?" 3e-8).
"""

from __future__ import annotations

import enum
from collections.abc import Collection
from dataclasses import dataclass

from mediaserver.config import Settings
from mediaserver.turns.words import ends_unfinished

# Whisper's marks of a sentence it hears as finished.
SENTENCE_ENDINGS = (".", "?", "!")


class Words(enum.Enum):
    """What the transcript of a pause says about the turn."""

    UNKNOWN = "unknown"  # not decoded yet (or no early final at all)
    FINISHED = "finished"  # ends on a sentence's final mark
    UNFINISHED = "unfinished"  # ends on a word or a mark no finished sentence ends on
    OPEN = "open"  # neither: no final mark ("10 of", "5 5"), or empty


def _stripped(text: str) -> str:
    """The transcript without trailing space and closing quotes or brackets."""
    return text.rstrip().rstrip("\"')]")


def text_skipped(text: str, skip_endings: Collection[str]) -> bool:
    """Whether the words of a pause get no text score: they end on one of ``skip_endings``
    (``turn_text_skip_endings``: Whisper's question mark)."""
    stripped = _stripped(text)
    return any(stripped.endswith(e) for e in skip_endings if e)


def classify(text: str, unfinished_words: Collection[str], unfinished_endings: Collection[str]) -> Words:
    """How the transcript decoded in a pause ends (see the module's rule)."""
    stripped = _stripped(text)
    if not stripped:
        return Words.OPEN
    if ends_unfinished(stripped, unfinished_words) or any(stripped.endswith(e) for e in unfinished_endings if e):
        return Words.UNFINISHED
    if stripped.endswith(SENTENCE_ENDINGS):
        return Words.FINISHED
    return Words.OPEN


@dataclass(frozen=True)
class TurnRule:
    """The rule's settings (``turn_*``), read once per session."""

    threshold: float
    rescore_threshold: float
    finished_silence_ms: int
    fallback_silence_ms: int  # a pause the model failed on ends as silence detection would
    unfinished_words: tuple[str, ...]
    unfinished_endings: tuple[str, ...]
    text_threshold: float = 0.01  # a text score below it vetoes the pause's end (the module's rule)
    text_hold_ms: int = 1000  # a pause the text vetoed ends at this silence
    open_silence_ms: int = 0  # the model's 'complete' on words without a final mark waits for this silence
    text_finished: float = 0.0  # a text score at least this makes words without a final mark finished (0: never)
    text_skip_endings: tuple[str, ...] = ()  # words ending on one of these get no text score

    @classmethod
    def of(cls, settings: Settings) -> TurnRule:
        return cls(
            threshold=settings.turn_threshold,
            rescore_threshold=settings.turn_rescore_threshold,
            finished_silence_ms=settings.turn_finished_silence_ms,
            fallback_silence_ms=settings.stream_vad_hangover_ms,
            unfinished_words=tuple(settings.turn_unfinished_words),
            unfinished_endings=tuple(settings.turn_unfinished_endings),
            text_threshold=settings.turn_text_threshold,
            text_hold_ms=settings.turn_text_hold_ms,
            open_silence_ms=settings.turn_open_silence_ms,
            text_finished=settings.turn_text_finished,
            text_skip_endings=tuple(settings.turn_text_skip_endings),
        )

    def text_scores(self, text: str) -> bool:
        """Whether the words of a pause are given to the text (``turn_text_skip_endings``)."""
        return bool(text.strip()) and not text_skipped(text, self.text_skip_endings)

    def words(self, text: str) -> Words:
        return classify(text, self.unfinished_words, self.unfinished_endings)

    def text_finishes(self, text: float | None) -> bool:
        """Whether the text's score reads the words as a finished sentence (``text_finished``)."""
        return text is not None and self.text_finished > 0 and text >= self.text_finished

    def text_vetoes(self, text: float | None) -> bool:
        """Whether the text's score (None: no text evidence) says the words are unfinished."""
        return text is not None and text < self.text_threshold

    def model_ends(self, probability: float, words: Words, *, first: bool, text: float | None = None) -> bool:
        """Whether a score ends the turn (rules 1 and 2, and the text's veto); ``first`` is the
        pause's first check, ``text`` the text's score of the words (None: none)."""
        if words is Words.UNFINISHED or self.text_vetoes(text):
            return False
        return probability >= (self.threshold if first else self.rescore_threshold)

    def model_end_silence_ms(self, words: Words) -> int:
        """The pause length from which the model's 'complete' ends the turn (rule 2): at once, but
        for words without a final mark ``open_silence_ms``."""
        return self.open_silence_ms if words is Words.OPEN else 0

    def silence_ends_ms(
        self, words: Words, *, model_failed: bool, text: float | None = None, model_agreed: bool = False
    ) -> int | None:
        """The pause length at which the turn ends (rules 2-4, and the text's hold), or None: the
        model or the eagerness cap decides. ``model_agreed``: the model's 'complete' waits for the
        silence (``model_end_silence_ms``)."""
        ends = [self.fallback_silence_ms] if model_failed else []
        if self.text_vetoes(text):
            ends.append(self.text_hold_ms)
        else:
            # Finished words, or words without a mark that the text reads as a sentence (rule 3).
            finished = words is Words.FINISHED or (words is Words.OPEN and self.text_finishes(text))
            if finished and self.finished_silence_ms > 0:
                ends.append(self.finished_silence_ms)
            if model_agreed and words is not Words.UNFINISHED:
                ends.append(self.model_end_silence_ms(words))
        return min(ends) if ends else None
