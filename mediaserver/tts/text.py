"""Text for speech: sentence splitting, whole texts and streams of deltas, and light clean-up.

Sentences are found by pysbd (rule-based, with English abbreviation lists), so a decimal number
(``3.5``), a time (``7:30 p.m.``) or an abbreviation (``Dr.``, ``e.g.``, ``U.S.``) never ends a
sentence. Numbers themselves are read as words by Piper's phonemizer (espeak-ng): ``3.5`` is
"three point five", ``7:30`` "seven thirty", ``$3.50`` "three dollars fifty", ``1,250`` "one
thousand two hundred and fifty"; nothing here rewrites them.

pysbd only segments a complete text. ``SentenceSplitter`` makes it incremental: it re-segments
the text not yet emitted each time a delta arrives and emits every sentence but the last (the last
may still grow: "It is 3." can become "It is 3.5 degrees."). A run without any boundary is cut at
the last clause mark or space once it passes ``max_sentence_chars``, so a text without punctuation
still streams and the re-segmenting stays bounded.
"""

from __future__ import annotations

import functools
import html
import logging
import re
import unicodedata
from typing import Any

log = logging.getLogger(__name__)

# Markdown that LLM answers carry and a voice should not read aloud ("asterisk", "hash").
_MARKUP = re.compile(r"(\*{1,3}|_{2,3}|`{1,3}|^#{1,6}\s+|^\s*[-*+]\s+)", re.MULTILINE)
_SPACES = re.compile(r"\s+")
# Emoji: Piper's phonemizer reads them by name ("slightly smiling face", a Home Assistant trial: an
# LLM's answers carry them). Pictographs, flags, skin tones, dingbats and the symbols shown as emoji
# (☀ ✔ ⭐ ⌛ ▶ ‼ ℹ ...), with their presentation selectors, keycap marks and tags, and the joiner only
# between two of them (it also joins letters in Sinhala and Malayalam). Other symbols stay: "25 °C"
# reads "25 degrees C", musical signs ("C♯"), "©", "%", "→" (a review).
_EMOJI_CHAR = (
    "\U0001f000-\U0001faff\u2600-\u2668\u2670-\u27bf\u2b00-\u2bff\u231a\u231b\u23e9-\u23fa"
    "\u25aa\u25ab\u25b6\u25c0\u25fb-\u25fe\u203c\u2049\u2139\u24c2\u3030\u303d\u3297\u3299"
)
_EMOJI_MARKS = "\ufe0e\ufe0f\u20e3\U000e0020-\U000e007f"
_EMOJI = re.compile(f"[{_EMOJI_CHAR}][{_EMOJI_MARKS}]*(?:\u200d[{_EMOJI_CHAR}][{_EMOJI_MARKS}]*)*|[{_EMOJI_MARKS}]+")
_SOFT_BREAK = re.compile(r"[,;:\u2013\u2014)](?=\s)")
# Words a phrase starts with (a conjunction, a relative pronoun, a preposition): where a long first
# sentence with no clause mark may be cut (``first_phrase_words``), the word starting the second piece.
_PHRASE_WORDS = (
    "and but or so because which that who whom whose where when while with without from for in on at to by as if "
    "than using through into during after before until"
)
PHRASE_STARTS = frozenset(_PHRASE_WORDS.split())
_WORD = re.compile(r"\S+(?=\s)")

DEFAULT_MAX_SENTENCE_CHARS = 400


@functools.cache
def _segmenter() -> Any:
    import pysbd

    return pysbd.Segmenter(language="en", clean=False)


_SSML_TAG = re.compile(r"<[^<>]*>")


def readable(text: str) -> bool:
    """Whether ``text`` has anything to read: a letter or a digit (emoji and marks alone have not)."""
    return any(ch.isalnum() for ch in text)


def ssml_to_text(text: str) -> str:
    """A whole text given as SSML (``<speak>...</speak>``) read as its words: Piper reads no SSML,
    and read the tags aloud ("speak ... slash speak", a Home Assistant trial). Tags become spaces,
    entities characters; any other text is returned as it is."""
    if not text.lstrip()[:6].lower().startswith("<speak"):
        return text
    return html.unescape(_SSML_TAG.sub(" ", text))


def clean_text(text: str) -> str:
    """Text as it should be spoken: control characters and markdown markers out, spaces collapsed.

    Newlines become spaces (WAS strips them for the same reason: they broke WIS's TTS). Emoji go:
    the voice would read their names.
    """
    text = _MARKUP.sub("", text)  # before newlines go: headings and bullets start a line
    text = _EMOJI.sub(" ", text)
    text = "".join(" " if unicodedata.category(ch) in ("Cc", "Zl", "Zp") else ch for ch in text)
    return _SPACES.sub(" ", text).strip()


# Characters pysbd uses as placeholders while it segments (its rules swap them in for periods and
# the like, then back): text holding one lost words ("Play in B♭ major. Then stop." segmented to
# "Then stop."; a review). They are segmented as private-use characters, one for one, and restored.
_PYSBD_PLACEHOLDERS = "ƪȸȹᓰᓱᓳᓴᓷᓸ∮∯⌬⎋☄☇☈☉☏☝♝♟♨♬♭✂"
_TO_PRIVATE = str.maketrans({ch: chr(0xE000 + i) for i, ch in enumerate(_PYSBD_PLACEHOLDERS)})


def _segment(text: str) -> list[str]:
    """pysbd's segments, each with its trailing whitespace (they concatenate to ``text``)."""
    if not text.strip():
        return []
    lead = len(text) - len(text.lstrip())  # (pysbd drops leading spaces: they go with the first part)
    safe = text[lead:].translate(_TO_PRIVATE)
    parts: list[str] = _segmenter().segment(safe)
    if "".join(parts) != safe:  # (pysbd dropped or changed something: the text stays whole)
        log.warning("sentence splitting changed the text; it is read as one piece: %r", text[:80])
        return [text]
    out: list[str] = []
    start = lead
    for part in parts:  # the original characters, at the same places
        out.append(text[start : start + len(part)])
        start += len(part)
    out[0] = text[:lead] + out[0]
    return out


def _cut_long(text: str, max_chars: int) -> tuple[str, str]:
    """Split a too-long run at the last clause mark (else space) before ``max_chars``."""
    window = text[:max_chars]
    cut = -1
    for match in _SOFT_BREAK.finditer(window):
        cut = match.end()
    if cut <= max_chars // 4:
        space = window.rfind(" ")
        cut = space if space > max_chars // 4 else max_chars
    return text[:cut], text[cut:]


def split_sentences(text: str, *, max_sentence_chars: int = DEFAULT_MAX_SENTENCE_CHARS) -> list[str]:
    """A whole text → its sentences, cleaned, none longer than ``max_sentence_chars``."""
    splitter = SentenceSplitter(max_sentence_chars=max_sentence_chars)
    return [*splitter.push(text), *splitter.flush()]


class SentenceSplitter:
    """Text deltas in (LLM tokens, Wyoming ``synthesize-chunk``), complete sentences out.

    ``push`` returns the sentences a delta completed; ``flush`` (at the end of the text) returns
    what is left. Sentences come back cleaned (``clean_text``) and never empty.

    ``first_clause_words``: the first piece of the text may end at a clause mark (comma, semicolon,
    colon, dash) once it has this many words, rather than at the end of the first sentence: a spoken
    answer then starts before the LLM has written (and Piper synthesized) a whole first sentence.
    0 waits for whole sentences, as a text that is read out should.
    """

    def __init__(
        self,
        *,
        max_sentence_chars: int = DEFAULT_MAX_SENTENCE_CHARS,
        first_clause_words: int = 0,
        first_phrase_words: int = 0,
    ) -> None:
        self.max_sentence_chars = max(20, max_sentence_chars)
        self.first_clause_words = first_clause_words
        self.first_phrase_words = first_phrase_words
        self._pending = ""
        self._emitted = False

    @property
    def pending(self) -> str:
        """Text received but not yet part of an emitted sentence."""
        return self._pending

    def push(self, delta: str) -> list[str]:
        if not delta:
            return []
        self._pending += delta
        out: list[str] = []
        segments = _segment(self._pending)
        if len(segments) > 1:
            complete = "".join(segments[:-1])
            out += self._emit(segments[:-1])
            self._pending = self._pending[len(complete) :] if self._pending.startswith(complete) else segments[-1]
        while len(self._pending) > self.max_sentence_chars:
            head, self._pending = _cut_long(self._pending, self.max_sentence_chars)
            out += self._emit([head])
        if not out and not self._emitted and self.first_clause_words:
            for match in _SOFT_BREAK.finditer(self._pending):
                head = self._pending[: match.end()]
                if len(head.split()) >= self.first_clause_words:
                    out += self._emit([head])
                    self._pending = self._pending[match.end() :]
                    break
        if not out and not self._emitted and self.first_phrase_words:
            out += self._first_phrase()
        self._emitted = self._emitted or bool(out)
        return out

    def _first_phrase(self) -> list[str]:
        """A first sentence still without a clause mark after ``first_phrase_words`` words ends its
        first piece before the next word that starts a phrase (``PHRASE_STARTS``), once that word is
        complete: "The best breakfast for a spider would be a meal made | from a combination ..."."""
        words = list(_WORD.finditer(self._pending))
        for index in range(self.first_phrase_words, len(words)):
            word = words[index]
            if word.group().lower().strip("\"'(") in PHRASE_STARTS:
                head = self._pending[: word.start()]
                self._pending = self._pending[word.start() :]
                return self._emit([head])
        return []

    def flush(self) -> list[str]:
        rest, self._pending = self._pending, ""
        out: list[str] = []
        while len(rest) > self.max_sentence_chars:
            head, rest = _cut_long(rest, self.max_sentence_chars)
            out += self._emit([head])
        return out + self._emit(_segment(rest))

    def _emit(self, segments: list[str]) -> list[str]:
        out: list[str] = []
        for segment in segments:
            sentence = clean_text(segment)
            if any(ch.isalnum() for ch in sentence):
                out.append(sentence)
            elif sentence and out:  # lone punctuation ("...", "?!") belongs to the sentence before
                out[-1] += sentence
        return out
