"""The end-of-turn rule (turns/decision.py): how a pause's words read, and what ends the turn."""

from __future__ import annotations

import pytest

from mediaserver.config import Settings
from mediaserver.turns.decision import TurnRule, Words, classify
from mediaserver.turns.words import DEFAULT_UNFINISHED_ENDINGS, DEFAULT_UNFINISHED_WORDS

WORDS, ENDINGS = DEFAULT_UNFINISHED_WORDS, DEFAULT_UNFINISHED_ENDINGS


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # Whisper tiny.en's own transcripts of the suite's real recordings and their fragments.
        ("Feels like these days go on forever.", Words.FINISHED),
        ("What time is it in Tokyo?", Words.FINISHED),
        ("Good morning!", Words.FINISHED),
        ('He said "yes."', Words.FINISHED),
        ("He was not an ill...", Words.UNFINISHED),
        ("Feels like these\u2026", Words.UNFINISHED),
        ("7 of Cl-", Words.UNFINISHED),
        ("Go somewhere,", Words.UNFINISHED),
        ("How far is it from here to the", Words.UNFINISHED),
        ("Add milk, eggs, and", Words.UNFINISHED),
        ("Turn on the.", Words.UNFINISHED),  # a word no sentence ends on, whatever mark follows
        ("10 of", Words.OPEN),
        ("5 5", Words.OPEN),
        ("", Words.OPEN),
        ("   ", Words.OPEN),
    ],
)
def test_words_of_a_pause(text: str, expected: Words) -> None:
    assert classify(text, WORDS, ENDINGS) is expected


def test_no_unfinished_endings_leaves_the_marks_to_the_model() -> None:
    assert classify("He was not an ill...", WORDS, ()) is Words.FINISHED  # "..." ends in "."
    assert classify("7 of Cl-", WORDS, ()) is Words.OPEN
    assert classify("How far is it from here to the", (), ()) is Words.OPEN


def rule(**update: object) -> TurnRule:
    return TurnRule.of(Settings(_env_file=None).model_copy(update=update))


def test_the_model_ends_a_turn_unless_its_words_read_unfinished() -> None:
    r = rule()
    assert r.model_ends(0.6, Words.OPEN, first=True)
    assert r.model_ends(0.6, Words.FINISHED, first=True)
    assert r.model_ends(0.6, Words.UNKNOWN, first=True)
    assert not r.model_ends(0.99, Words.UNFINISHED, first=True)
    assert not r.model_ends(0.6, Words.OPEN, first=False)  # a rescore needs turn_rescore_threshold (0.9)
    assert r.model_ends(0.95, Words.OPEN, first=False)
    assert not r.model_ends(0.4, Words.FINISHED, first=True)


def test_the_models_end_of_words_without_a_final_mark_waits_for_the_open_silence() -> None:
    r = rule()
    assert r.model_end_silence_ms(Words.OPEN) == Settings(_env_file=None).turn_open_silence_ms == 400
    assert r.model_end_silence_ms(Words.FINISHED) == 0  # "Turn off the lights." ends at the model's word
    assert r.model_end_silence_ms(Words.UNKNOWN) == 0
    # Once the model agreed, the pause ends at that silence (OPEN) or as before (FINISHED: at once or at 600).
    assert r.silence_ends_ms(Words.OPEN, model_failed=False, model_agreed=True) == 400
    assert r.silence_ends_ms(Words.OPEN, model_failed=False) is None
    assert r.silence_ends_ms(Words.UNFINISHED, model_failed=False, model_agreed=True) is None
    assert rule(turn_open_silence_ms=700).silence_ends_ms(Words.OPEN, model_failed=False, model_agreed=True) == 700
    assert rule(turn_open_silence_ms=0).model_end_silence_ms(Words.OPEN) == 0
    # The text's veto still holds the pause to turn_text_hold_ms.
    assert r.silence_ends_ms(Words.OPEN, model_failed=False, text=0.0005, model_agreed=True) == r.text_hold_ms


def test_a_finished_sentence_ends_at_its_silence_whatever_the_model_says() -> None:
    r = rule()
    assert r.silence_ends_ms(Words.FINISHED, model_failed=False) == Settings(_env_file=None).turn_finished_silence_ms
    assert r.silence_ends_ms(Words.OPEN, model_failed=False) is None
    assert r.silence_ends_ms(Words.UNFINISHED, model_failed=False) is None
    assert r.silence_ends_ms(Words.UNKNOWN, model_failed=False) is None
    assert rule(turn_finished_silence_ms=900).silence_ends_ms(Words.FINISHED, model_failed=False) == 900
    assert rule(turn_finished_silence_ms=0).silence_ends_ms(Words.FINISHED, model_failed=False) is None


def test_a_pause_the_model_failed_on_ends_as_silence_detection_would() -> None:
    r = rule(stream_vad_hangover_ms=700, turn_finished_silence_ms=900)
    for words in Words:
        assert r.silence_ends_ms(words, model_failed=True) == 700
    assert (
        rule(stream_vad_hangover_ms=700, turn_finished_silence_ms=400).silence_ends_ms(
            Words.FINISHED, model_failed=True
        )
        == 400
    )


def test_settings_reach_the_rule() -> None:
    r = rule(turn_threshold=0.3, turn_rescore_threshold=0.6, turn_unfinished_words=["for"], turn_unfinished_endings=[])
    assert r.model_ends(0.35, Words.OPEN, first=True) and r.model_ends(0.65, Words.OPEN, first=False)
    assert r.words("Set an alarm for") is Words.UNFINISHED
    assert r.words("Turn on the") is Words.OPEN
    assert r.words("He was not an ill...") is Words.FINISHED


def test_a_low_text_score_vetoes_the_model_and_the_finished_words() -> None:
    """turn_text_model: words the text scores below turn_text_threshold keep the model's 'complete'
    and the finished words from ending the turn; that pause ends at turn_text_hold_ms instead."""
    r = rule(turn_text_threshold=0.05, turn_text_hold_ms=1300, turn_finished_silence_ms=600)
    assert not r.model_ends(0.99, Words.FINISHED, first=True, text=0.04)
    assert not r.model_ends(0.99, Words.OPEN, first=False, text=0.0)
    assert r.silence_ends_ms(Words.FINISHED, model_failed=False, text=0.04) == 1300
    assert r.silence_ends_ms(Words.OPEN, model_failed=False, text=0.04) == 1300
    # Words that read unfinished too: the hold bounds the wait (tools/README.md, bench_turns.py, stop 60).
    assert r.silence_ends_ms(Words.UNFINISHED, model_failed=False, text=0.04) == 1300
    # At or above the threshold (here 0.05), or no score: the rule as without it.
    assert r.model_ends(0.6, Words.FINISHED, first=True, text=0.05)
    assert r.model_ends(0.6, Words.FINISHED, first=True, text=None)
    assert not r.model_ends(0.99, Words.UNFINISHED, first=True, text=0.9)
    assert r.silence_ends_ms(Words.FINISHED, model_failed=False, text=0.05) == 600
    assert r.silence_ends_ms(Words.FINISHED, model_failed=False, text=None) == 600
    assert r.silence_ends_ms(Words.OPEN, model_failed=False, text=0.05) is None
    assert r.silence_ends_ms(Words.OPEN, model_failed=False, text=0.5) == 600  # reads finished (turn_text_finished)
    assert r.text_vetoes(0.049) and not r.text_vetoes(0.05) and not r.text_vetoes(None)


def test_the_text_hold_and_a_failed_model() -> None:
    """A pause the model failed on still ends as silence detection would when that comes first."""
    r = rule(stream_vad_hangover_ms=700, turn_text_hold_ms=900)
    assert r.silence_ends_ms(Words.FINISHED, model_failed=True, text=0.0005) == 700
    assert (
        rule(stream_vad_hangover_ms=700, turn_text_hold_ms=500).silence_ends_ms(
            Words.OPEN, model_failed=True, text=0.0005
        )
        == 500
    )


def test_text_settings_defaults_and_limits() -> None:
    settings = Settings(_env_file=None)
    assert settings.turn_text_model == "auto"
    assert (settings.turn_text_threshold, settings.turn_text_hold_ms) == (0.001, 1000)
    r = TurnRule.of(settings)
    assert r.text_vetoes(0.00099) and not r.text_vetoes(0.001)
    for bad in ({"turn_text_threshold": 0}, {"turn_text_threshold": 1}, {"turn_text_hold_ms": 0}):
        with pytest.raises(ValueError):
            Settings.model_validate({**bad})
    with pytest.raises(ValueError):
        Settings.model_validate({"turn_text_model": "gpt"})


def test_words_without_a_mark_that_the_text_reads_as_a_sentence_end_as_finished_words() -> None:
    """turn_text_finished: 'Remind me to buy eggs and bread' (no final mark, the model scored it low:
    it waited the cap) ends at turn_finished_silence_ms once the text scores it at least this."""
    r = rule(turn_text_finished=0.3, turn_finished_silence_ms=650)
    assert Settings(_env_file=None).turn_text_finished == 0.1
    assert r.silence_ends_ms(Words.OPEN, model_failed=False, text=0.3) == 650
    assert r.silence_ends_ms(Words.OPEN, model_failed=False, text=0.29) is None  # below it: the model and the cap
    assert r.silence_ends_ms(Words.OPEN, model_failed=False, text=None) is None  # no text: as without it
    assert r.silence_ends_ms(Words.UNFINISHED, model_failed=False, text=0.9) is None  # unfinished words still win
    assert r.silence_ends_ms(Words.OPEN, model_failed=False, text=0.9, model_agreed=True) == 400  # the model sooner
    assert rule(turn_text_finished=0).silence_ends_ms(Words.OPEN, model_failed=False, text=0.9) is None  # off
    assert (
        rule(turn_text_finished=0.3, turn_finished_silence_ms=0).silence_ends_ms(
            Words.OPEN, model_failed=False, text=0.9
        )
        is None
    )  # the finished words' end is off too


def test_which_words_are_given_to_the_text() -> None:
    """``turn_text_skip_endings``: the default keeps Whisper's questions from the text (closing
    quotes aside); empty, every pause with words is scored; no words, no score."""
    rule = TurnRule.of(Settings(_env_file=None))
    assert rule.text_skip_endings == ("?",)
    assert not rule.text_scores("What colors the sky?") and not rule.text_scores('He asked "why?" ')
    assert rule.text_scores("Remind me to buy.") and rule.text_scores("10 of")
    assert not rule.text_scores("  ")
    every = TurnRule.of(Settings(_env_file=None, turn_text_skip_endings=[]))
    assert every.text_scores("What colors the sky?") and not every.text_scores("")
    stops = TurnRule.of(Settings(_env_file=None, turn_text_skip_endings=["?", "!"]))
    assert not stops.text_scores("Good morning!") and stops.text_scores("Remind me to buy.")
