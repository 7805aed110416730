"""The suite's WER: formatting Whisper varies on is not counted as a word error; real errors are."""

from __future__ import annotations

from tests.wer import normalize, word_error_rate


def test_a_clock_time_is_one_word_written_either_way() -> None:
    assert normalize("Set for 6:30 tomorrow.") == normalize("set for 630 tomorrow") == "set for 630 tomorrow"
    assert word_error_rate("The alarm is set for 6:30.", "The alarm is set for 630.") == 0.0


def test_real_word_errors_still_count() -> None:
    assert word_error_rate("Sleep well, Anna.", "Sleep well, Annet.") > 0
    assert word_error_rate("set for 6:30", "set for 6:45") > 0
    assert normalize("ratio 3:1, well-known") == "ratio 3 1 well known"  # not a clock time
