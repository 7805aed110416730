"""A window's tail: the audio Whisper left unfinished, decoded again after the text it follows.

When a decode with timestamps ends on a segment Whisper did not finish, the audio from the last
complete segment's end is decoded again (``WhisperEngine._take_single``). Whisper's end timestamps
run early, often by half a second, so that audio still holds the end of the last word already
written. Decoded alone, a second of a word's end is where Whisper hallucinates: tiny.en wrote
"you." and "Knock!" (for "not") in JFK's sentence said six times over a minute, and on another
CPU "Thank you for you.".

What Whisper's own loop does instead: the next window is conditioned on the text so far. A tail
here gets that text as its prompt (``Window.follows``), and then writes the word it re-heard
("for you", "not.") rather than inventing one; the words that repeat the end of the text they
follow are dropped, as whisper_streaming's hypothesis buffer drops the n-grams it has already
committed. A phrase is dropped only where the tail starts with it and the text before ends with
it, at most ``MAX_OVERLAP_WORDS`` words.
"""

from __future__ import annotations

from typing import Any

from mediaserver.asr.guards import normalized_words

MAX_OVERLAP_WORDS = 5


def overlap_words(before: str, after: str, max_words: int = MAX_OVERLAP_WORDS) -> int:
    """How many words ``after`` starts with that ``before`` ends with (the longest such run)."""
    head, tail = normalized_words(before), normalized_words(after)
    for n in range(min(max_words, len(head), len(tail)), 0, -1):
        if head[-n:] == tail[:n]:
            return n
    return 0


def drop_repeated_start(segments: list[dict[str, Any]], follows: str, tokenizer: Any) -> list[dict[str, Any]]:
    """``segments`` (a tail's, in order) without the words at their start that repeat the end of
    ``follows``; a segment left with no words is dropped. Each segment's ``text`` and ``tokens``
    stay consistent: words are cut at token boundaries, timestamp tokens are kept."""
    drop = overlap_words(follows, " ".join(seg["text"] for seg in segments))
    kept: list[dict[str, Any]] = []
    for seg in segments:
        if drop == 0:
            kept.append(seg)
            continue
        words = normalized_words(seg["text"])
        if len(words) <= drop:
            drop -= len(words)
            continue
        cut = _cut_words(seg, drop, tokenizer)
        kept.append(seg if cut is None else cut)  # (None: no token boundary after those words)
        drop = 0
    return kept


def _cut_words(seg: dict[str, Any], words: int, tokenizer: Any) -> dict[str, Any] | None:
    tokens = list(seg["tokens"])
    text_at = [k for k, token in enumerate(tokens) if token < tokenizer.eot]
    wanted = normalized_words(seg["text"])[:words]
    for i in range(1, len(text_at)):
        if normalized_words(tokenizer.decode([tokens[k] for k in text_at[:i]])) == wanted:
            while i < len(text_at) and not normalized_words(tokenizer.decode([tokens[text_at[i]]])):
                i += 1  # the repeated word's punctuation goes with it
            removed = set(text_at[:i])
            rest = [token for k, token in enumerate(tokens) if k not in removed]
            text = tokenizer.decode([token for token in rest if token < tokenizer.eot])
            if normalized_words(text) != normalized_words(seg["text"])[words:]:
                return None  # the cut split a word
            return dict(seg, text=text, tokens=tuple(rest))
    return None
