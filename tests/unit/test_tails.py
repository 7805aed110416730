"""A tail's words that repeat the text before it are dropped, cut at the model's token boundaries."""

from __future__ import annotations

from typing import Any

import pytest
import tokenizers
from faster_whisper.tokenizer import Tokenizer

from mediaserver.asr.models import bundled_tiny_en_dir
from mediaserver.asr.tails import drop_repeated_start, overlap_words


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    path = bundled_tiny_en_dir()
    assert path is not None
    return Tokenizer(tokenizers.Tokenizer.from_file(str(path / "tokenizer.json")), False)


def segment(tokenizer: Tokenizer, text: str, start: float, end: float) -> dict[str, Any]:
    at = tokenizer.timestamp_begin
    tokens = (at + round(start / 0.02), *tokenizer.encode(text), at + round(end / 0.02))
    return {"start": start, "end": end, "text": text, "tokens": tokens}


def test_overlap_is_the_longest_run_the_text_ends_and_the_tail_starts_with() -> None:
    assert overlap_words("what your country can do for you", "for you") == 2
    assert overlap_words("And so my fellow Americans ask not", " not.") == 1
    assert overlap_words("And so my fellow Americans ask not", "Knock!") == 0
    assert overlap_words("no no", "no no no") == 2
    assert overlap_words("", "anything") == 0
    assert overlap_words("a b c d e f", "a b c d e f", max_words=5) == 0  # only a run of five or fewer
    assert overlap_words("x a b c d e", "a b c d e then", max_words=5) == 5


def test_the_repeated_words_and_their_punctuation_go_and_the_tokens_stay_in_step(tokenizer: Tokenizer) -> None:
    [seg] = drop_repeated_start([segment(tokenizer, " for you, and then some.", 0.0, 2.0)], "can do for you", tokenizer)
    assert seg["text"] == " and then some."
    assert tokenizer.decode([t for t in seg["tokens"] if t < tokenizer.eot]) == seg["text"]
    timestamps = [t for t in seg["tokens"] if t >= tokenizer.timestamp_begin]
    assert timestamps == [tokenizer.timestamp_begin, tokenizer.timestamp_begin + 100]  # kept


def test_a_segment_that_only_repeats_is_dropped_and_the_next_is_cut(tokenizer: Tokenizer) -> None:
    segments = [segment(tokenizer, " not.", 0.0, 0.5), segment(tokenizer, " what your country", 0.5, 2.0)]
    assert [s["text"] for s in drop_repeated_start(segments, "ask not", tokenizer)] == [" what your country"]
    segments = [segment(tokenizer, " can do", 0.0, 0.5), segment(tokenizer, " for you. Ask what", 0.5, 2.0)]
    assert [s["text"] for s in drop_repeated_start(segments, "can do for you", tokenizer)] == [" Ask what"]


def test_new_words_are_kept_whole(tokenizer: Tokenizer) -> None:
    segments = [segment(tokenizer, " Knock!", 0.0, 0.6)]
    assert drop_repeated_start(segments, "ask not", tokenizer) == segments
    # "you" is not "your": a word is dropped only whole
    segments = [segment(tokenizer, " your country", 0.0, 1.0)]
    assert drop_repeated_start(segments, "for you", tokenizer) == segments
