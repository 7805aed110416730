"""Word error rate, one way for every test and tool, so WERs in tools/README compare across tools.

Normalization: lower case; a clock time's colon is dropped ("6:30" and "630" are the same spoken
words, and Whisper writes either); every other character that is neither a word character, white
space nor an apostrophe becomes a space ("well-known" is two words, "don't" stays one); spaces
collapsed.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import jiwer

_PUNCTUATION = re.compile(r"[^\w\s']")
_CLOCK_COLON = re.compile(r"(?<=\d):(?=\d\d\b)")


def normalize(text: str) -> str:
    text = _CLOCK_COLON.sub("", text.lower())
    return " ".join(_PUNCTUATION.sub(" ", text).split())


_ONES = [
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
]
_TENS = ["_", "_", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]


def _number_words(match: re.Match[str]) -> str:
    n = int(match.group())
    if n < 20:
        return _ONES[n]
    if n < 100:
        return _TENS[n // 10] + ("" if n % 10 == 0 else " " + _ONES[n % 10])
    return match.group()


def spoken_form(text: str) -> str:
    """Numbers below 100 as words and "Mr." as "mister", for references written as they are spoken
    (the real recordings of tests/human_speech.py): Whisper writes "10 of clubs" for "ten of clubs".
    Apply it to both sides before ``normalize``."""
    text = re.sub(r"\bMr\b\.?", "mister", text, flags=re.IGNORECASE)
    return re.sub(r"\d+", _number_words, text)


def word_error_rate(reference: str, hypothesis: str) -> float:
    """One utterance's WER; an empty hypothesis is a WER of 1 (nothing was recognized)."""
    ref, hyp = normalize(reference), normalize(hypothesis)
    if not hyp:
        return 1.0
    return float(jiwer.wer(ref, hyp))


def corpus_error_rates(references: Sequence[str], hypotheses: Sequence[str]) -> tuple[float, float] | None:
    """Corpus WER and CER (edits over all references' words / characters), pairs with an empty
    reference left out; None when nothing is left to score."""
    pairs = [(normalize(r), normalize(h)) for r, h in zip(references, hypotheses, strict=True)]
    pairs = [(r, h) for r, h in pairs if r]
    if not pairs:
        return None
    refs, hyps = [r for r, _ in pairs], [h for _, h in pairs]
    return float(jiwer.wer(refs, hyps)), float(jiwer.cer(refs, hyps))


def corpus_wer(references: Sequence[str], hypotheses: Sequence[str]) -> float | None:
    rates = corpus_error_rates(references, hypotheses)
    return None if rates is None else rates[0]
