"""Loop and hallucination guards that work on short texts.

Whisper's own loop test is the gzip compression ratio of the text (> 2.4), which cannot fire on a
short text: gzip's fixed overhead keeps the ratio of a 40-character text near 1 however repetitive
it is. A 1.1 s command decoded as the same three words four times passes it. These checks look at
what a short text can show instead, measured against the audio it came from:

- ``repetition``: a phrase of two or more words said three or more times in a row ("turn it off
  turn it off turn it off"), or one word said ``2 x repeat_min`` times in a row. A single word said
  a few times ("no no no no") is ordinary speech and is left to the speaking-rate test.
- ``speaking_rate``: more words than the voiced audio could hold (``max_words_per_s`` words per
  second of speech, plus one word of slack). People speak 2-4 words a second; a loop on 0.85 s of
  speech gives twelve.
- ``no_speech``: text on audio the VAD hears no speech in.

A decode that trips one is decoded again the safe way (``WhisperEngine``: 30 s window, no forced
prefix, temperature fallback); a partial that trips one is dropped. The checks are pure functions
of the text and the voiced seconds so that every path (uploads, finals, partials) applies the same.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

GuardReason = Literal["repetition", "speaking_rate", "no_speech"]
GUARD_REASONS: tuple[GuardReason, ...] = ("repetition", "speaking_rate", "no_speech")

_WORD = re.compile(r"[\w']+")


@dataclass(frozen=True)
class GuardConfig:
    """``max_words_per_s``: words per second of voiced audio above which a decode is a loop (0: off);
    ``repeat_min``: times a phrase of two or more words may follow itself before it is a loop (0: off)."""

    max_words_per_s: float = 6.0
    repeat_min: int = 3


def normalized_words(text: str) -> list[str]:
    """Lower-case words without punctuation: what the guards (and seam alignment) compare."""
    return _WORD.findall(text.lower())


def repeated_phrase(words: list[str], repeat_min: int) -> tuple[str, ...] | None:
    """The first phrase that follows itself ``repeat_min`` times in a row (two or more words), or a
    single word that does so ``2 * repeat_min`` times; None when there is none."""
    if repeat_min < 2:
        return None
    count = len(words)
    for size in range(1, count // repeat_min + 1):
        needed = repeat_min if size > 1 else 2 * repeat_min
        if size * needed > count:
            continue
        for start in range(0, count - size * needed + 1):
            phrase = words[start : start + size]
            times = 1
            position = start + size
            while position + size <= count and words[position : position + size] == phrase:
                times += 1
                position += size
            if times >= needed:
                return tuple(phrase)
    return None


def check_text(text: str, voiced_s: float, config: GuardConfig) -> GuardReason | None:
    """Why this decode of audio with ``voiced_s`` seconds of speech cannot be right, or None."""
    words = normalized_words(text)
    if not words:
        return None
    if voiced_s <= 0.0:
        return "no_speech"
    if config.max_words_per_s > 0 and len(words) > config.max_words_per_s * voiced_s + 1:
        return "speaking_rate"
    if config.repeat_min and repeated_phrase(words, config.repeat_min) is not None:
        return "repetition"
    return None
