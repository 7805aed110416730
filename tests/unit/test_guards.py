"""The loop and hallucination guards on short texts (asr/guards.py) and the seam between promised
partial text and a final decoded without a forced prefix (stream.partials.continuation)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from mediaserver.asr.engine import AsrJob, WhisperEngine
from mediaserver.asr.guards import GuardConfig, check_text, normalized_words, repeated_phrase
from mediaserver.asr.service import AsrService
from mediaserver.audio.segmenter import Utterance, VadSegmenter
from mediaserver.config import Settings
from mediaserver.events import Transcript, TranscriptionOptions
from mediaserver.stream.options import segmenter_config
from mediaserver.stream.partials import continuation

GUARDS = GuardConfig(max_words_per_s=6.0, repeat_min=3)


def test_a_short_phrase_said_four_times_is_a_loop_gzip_cannot_see() -> None:
    # The defect: a 1.1 s command came back four times. Whisper's compression-ratio test cannot fire
    # on a text this short (gzip overhead), so it must be the repetition test that does.
    from faster_whisper.transcribe import get_compression_ratio

    text = "Turn it off. Turn it off. Turn it off. Turn it off."
    assert get_compression_ratio(text) < 2.4
    assert check_text(text, voiced_s=3.5, config=GUARDS) == "repetition"


def test_an_impossible_speaking_rate_is_a_loop() -> None:
    # Twelve words out of 0.85 s of speech: no one speaks 14 words a second.
    text = "Lights on in the kitchen please and the hallway and the garage too"
    assert check_text(text, voiced_s=0.85, config=GUARDS) == "speaking_rate"
    assert check_text(text, voiced_s=3.0, config=GUARDS) is None


def test_text_on_audio_without_speech_is_a_hallucination() -> None:
    assert check_text("Thank you.", voiced_s=0.0, config=GUARDS) == "no_speech"
    assert check_text("", voiced_s=0.0, config=GUARDS) is None


@pytest.mark.parametrize("text", ["No, no, no, no.", "no no no no", "Bye bye bye!"])
def test_a_word_said_a_few_times_slowly_is_not_rejected(text: str) -> None:
    assert check_text(text, voiced_s=2.5, config=GUARDS) is None


def test_a_long_legitimate_sentence_with_repeated_words_is_not_rejected() -> None:
    text = "I said that that is the one, and the one I want is the one on the left, not the right one."
    assert check_text(text, voiced_s=5.0, config=GUARDS) is None


def test_one_word_repeated_many_times_is_a_loop() -> None:
    assert check_text("the the the the the the the", voiced_s=3.0, config=GUARDS) == "repetition"


def test_guards_can_be_turned_off() -> None:
    off = GuardConfig(max_words_per_s=0.0, repeat_min=0)
    assert check_text("turn it off turn it off turn it off turn it off", voiced_s=0.8, config=off) is None


def test_repeated_phrase_names_the_phrase() -> None:
    words = ["please", "set", "a", "timer", "set", "a", "timer", "set", "a", "timer", "now"]
    assert repeated_phrase(words, 3) == ("set", "a", "timer")
    assert repeated_phrase(words[:7], 3) is None


@pytest.mark.parametrize(
    ("promised", "decoded", "expected"),
    [
        ("", "Turn on the lights.", "Turn on the lights."),
        # The seam defect: the final decode forced to continue the promise repeated its last word.
        ("Feels like these days go on forever.", "Feels like these days go on forever.", ""),
        ("Feels like these days go", "Feels like these days go on forever.", " on forever."),
        # Punctuation and case at the seam do not make a word new.
        ("And so my fellow Americans,", "And so, my fellow Americans, ask not what", " ask not what"),
        # A promised word the final spells differently still lines up with its twin.
        ("What is the weather like in pairs", "What is the weather like in Paris this afternoon?", " this afternoon?"),
        # The final heard less than was promised: nothing is taken back, nothing added.
        ("Turn on the kitchen lights", "Turn on the kitchen.", ""),
        ("Turn on", "", ""),
        # A promise that missed the decode's first word (a real LibriVox sentence, 4 streams): the seam
        # is after the promised word's twin, not one word in ("Mr. Mr. John").
        ("Mr.", "And Mr. John Dashwood had then leisure", " John Dashwood had then leisure"),
        ("Mr. John", "And Mr. John Dashwood had then leisure", " Dashwood had then leisure"),
    ],
)
def test_the_final_continues_the_promise_without_doubling_or_splitting_a_word(
    promised: str, decoded: str, expected: str
) -> None:
    assert continuation(promised, decoded) == expected


def streamed_utterance(clips: list[tuple[str, np.ndarray, str]], name: str, settings: Settings) -> np.ndarray:
    """The clip's utterance as a stream's VAD segmenter cuts it out of silence around it."""
    [audio] = [a for clip_name, a, _ in clips if clip_name == name]
    stream = np.concatenate([np.zeros(8000, np.float32), audio, np.zeros(24000, np.float32)])
    segmenter = VadSegmenter(segmenter_config(settings))
    events = [event for start in range(0, stream.size, 320) for event in segmenter.push(stream[start : start + 320])]
    [utterance] = [event for event in events if isinstance(event, Utterance)]
    return utterance.audio


async def test_a_real_command_that_loops_on_a_short_window_is_decoded_again_on_30_s(
    asr_service: AsrService, base_settings: Settings, human_clips: list[tuple[str, np.ndarray, str]]
) -> None:
    # The utterance as the stream's VAD cuts it out of silence around the real "ten of clubs". On a
    # 10 s encoder window, tiny.en said it four times over.
    utterance = streamed_utterance(human_clips, "cards_001", base_settings)
    engine = (await asr_service.get_model("tiny.en")).engine
    assert isinstance(engine, WhisperEngine)
    options = TranscriptionOptions(with_segment_timestamps=False)
    unguarded = replace(engine.guards, max_words_per_s=0.0, repeat_min=0)
    guarded = engine.guards
    try:
        engine.guards = unguarded
        [looped] = engine.transcribe_batch([AsrJob(utterance, options, min_window_s=10.0)])
    finally:
        engine.guards = guarded
    assert isinstance(looped, Transcript)
    assert len(normalized_words(looped.text)) >= 6, f"no loop to guard against any more: {looped.text!r}"
    before = dict(engine.counters)
    [result] = engine.transcribe_batch([AsrJob(utterance, options, min_window_s=10.0)])
    assert isinstance(result, Transcript)
    assert normalized_words(result.text) == ["10", "of", "clubs"], result.text
    assert result.guard in ("repetition", "speaking_rate")
    assert engine.counters[f"guard_redecode_{result.guard}"] == before[f"guard_redecode_{result.guard}"] + 1


async def test_a_partial_that_trips_a_guard_is_returned_marked_not_decoded_again(
    asr_service: AsrService, base_settings: Settings, human_clips: list[tuple[str, np.ndarray, str]]
) -> None:
    utterance = streamed_utterance(human_clips, "cards_001", base_settings)
    engine = (await asr_service.get_model("tiny.en")).engine
    assert isinstance(engine, WhisperEngine)
    job = AsrJob(utterance, TranscriptionOptions(with_segment_timestamps=False), min_window_s=10.0, on_guard="keep")
    [result] = engine.transcribe_batch([job])
    assert isinstance(result, Transcript)
    assert result.guard in ("repetition", "speaking_rate"), result.text


def test_a_transcript_is_grouped_by_the_window_each_segment_came_from() -> None:
    # What the guards judge one by one on a long upload: every second of audio in exactly one group.
    from mediaserver.asr.window_groups import window_groups
    from mediaserver.events import Segment

    def segment(window_s: float, start_s: float, end_s: float, text: str) -> Segment:
        return Segment(0, round(window_s * 100), start_s, end_s, text, (), 0.0, -0.2, 1.2, 0.1)

    segments = [
        segment(0.0, 0.4, 9.0, " one"),
        segment(0.0, 9.5, 27.0, " two"),
        segment(28.0, 28.2, 50.0, " three"),
        segment(51.0, 51.5, 60.0, " four"),
    ]
    groups = window_groups(segments, duration_s=61.0)
    assert [(g.start_s, g.end_s, g.text) for g in groups] == [
        (0.0, 28.2, " one two"),
        (28.2, 51.5, " three"),
        (51.5, 61.0, " four"),
    ]
    assert [seg.start_s for seg in groups[1].shifted(-28.2)] == [0.0]
