"""Word error rate, one way for every test and tool, so WERs in tools/README compare across tools.

Normalization: lower case; every character that is neither a word character, white space nor an
apostrophe becomes a space ("well-known" is two words, "don't" stays one); spaces collapsed.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import jiwer

_PUNCTUATION = re.compile(r"[^\w\s']")


def normalize(text: str) -> str:
    return " ".join(_PUNCTUATION.sub(" ", text.lower()).split())


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
