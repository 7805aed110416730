"""The streaming VAD segmenter on real Piper speech: pre-roll, hangover, discards, caps, flush."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from mediaserver.audio.segmenter import Discarded, SegmenterConfig, SpeechStart, Utterance, VadSegmenter
from tests.conftest import noise
from tests.human_speech import voiced_span

SR = 16000


def feed(segmenter: VadSegmenter, audio: np.ndarray, chunk: int = 320) -> list[Any]:
    events: list[Any] = []
    for start in range(0, audio.size, chunk):
        events += segmenter.push(audio[start : start + chunk])
    return events


def silence(seconds: float) -> np.ndarray:
    return np.zeros(int(seconds * SR), np.float32)


def test_an_utterance_is_cut_at_the_hangover_and_keeps_its_first_syllable(speech: Any) -> None:
    clip = speech("kitchen").audio16k
    segmenter = VadSegmenter(SegmenterConfig(hangover_ms=500, preroll_ms=300))
    events = feed(segmenter, np.concatenate([silence(1.0), clip, silence(1.0)]))
    starts = [e for e in events if isinstance(e, SpeechStart)]
    utterances = [e for e in events if isinstance(e, Utterance)]
    assert len(starts) == 1 and len(utterances) == 1
    utterance = utterances[0]
    assert utterance.reason == "silence"
    # Speech begins at 1.0 s; with pre-roll the utterance starts before it.
    assert utterance.start_ms <= 1000
    # It holds the whole clip plus at most pre-roll + hangover + a trigger window around it.
    duration_ms = utterance.audio.size * 1000 / SR
    clip_ms = clip.size * 1000 / SR
    assert clip_ms - 100 <= duration_ms <= clip_ms + 300 + 500 + 200
    assert utterance.end_ms - utterance.start_ms == round(duration_ms / 30) * 30


def test_two_utterances_split_by_a_pause(speech: Any) -> None:
    a, b = speech("kitchen").audio16k, speech("music").audio16k
    segmenter = VadSegmenter(SegmenterConfig(hangover_ms=400))
    events = feed(segmenter, np.concatenate([a, silence(1.2), b, silence(1.0)]))
    utterances = [e for e in events if isinstance(e, Utterance)]
    assert len(utterances) == 2
    assert utterances[0].end_ms < utterances[1].start_ms


def test_silence_and_a_click_give_no_utterance() -> None:
    segmenter = VadSegmenter(SegmenterConfig(min_speech_ms=200))
    click = silence(1.0)
    click[8000:8160] = 0.8  # 10 ms impulse
    events = feed(segmenter, np.concatenate([silence(2.0), click, silence(1.0)]))
    assert not [e for e in events if isinstance(e, Utterance)]
    assert all(isinstance(e, SpeechStart | Discarded) for e in events)


def test_a_burst_too_short_to_keep_ends_at_its_own_hangover(speech: Any) -> None:
    """With a 4 s hangover (semantic turns' cap) and burst_hangover_ms 500, a 90 ms burst is
    discarded 500 ms into its silence; a whole sentence still waits for the 4 s hangover."""
    clip, well = speech("kitchen").audio16k, speech("Well.").audio16k
    start, _ = voiced_span(well)
    burst = well[start : start + 90 * SR // 1000]  # a first syllable, shorter than min_speech_ms
    config = SegmenterConfig(hangover_ms=4000, burst_hangover_ms=500)
    events = feed(VadSegmenter(config), np.concatenate([silence(0.5), burst, silence(5.0)]))
    [discarded] = [e for e in events if isinstance(e, Discarded)]
    burst_end_ms = (SR // 2 + burst.size) * 1000 // SR
    assert 500 <= discarded.end_ms - burst_end_ms <= 500 + 150  # webrtcvad holds "voiced" a few frames
    events = feed(VadSegmenter(config), np.concatenate([silence(0.5), clip, silence(5.0)]))
    [utterance] = [e for e in events if isinstance(e, Utterance)]
    assert utterance.silence_ms >= 4000


def test_long_speech_is_cut_at_the_cap(speech: Any) -> None:
    long = np.concatenate([speech("story").audio16k, speech("garden").audio16k, speech("remind").audio16k])
    segmenter = VadSegmenter(SegmenterConfig(max_utterance_s=4.0, hangover_ms=2000))
    events = feed(segmenter, long)
    capped = [e for e in events if isinstance(e, Utterance) and e.reason == "max_length"]
    assert capped
    assert all(e.audio.size <= 4.0 * SR + 480 for e in capped)


def test_flush_ends_the_utterance_in_progress(speech: Any) -> None:
    segmenter = VadSegmenter()
    feed(segmenter, speech("weather").audio16k)
    assert segmenter.in_speech
    assert segmenter.current_audio().size > SR
    flushed = segmenter.flush()
    assert isinstance(flushed, Utterance) and flushed.reason == "flush"
    assert not segmenter.in_speech
    assert segmenter.flush() is None


@pytest.mark.parametrize("warmup_ms", [120, 0])
def test_a_streams_first_frames_of_noise_start_no_utterance(speech: Any, warmup_ms: int) -> None:
    """webrtcvad starts cold and calls a stream's first 90-120 ms voiced, a -60 dBFS noise floor
    included: every stream began with a speech start at 0 ms and its discard (a device trial). Over
    stream_vad_warmup_ms only frames louder than -35 dBFS count; speech from the first sample is
    still kept whole (0: the cold start shows)."""
    config = SegmenterConfig(warmup_ms=warmup_ms)
    floor = (np.random.default_rng(1).standard_normal(3 * SR) * 10 ** (-60 / 20)).astype(np.float32)
    events = feed(VadSegmenter(config), floor)
    assert (events == []) is (warmup_ms > 0), events
    clip = speech("weather").audio16k
    [utterance] = [
        e for e in feed(VadSegmenter(config), np.concatenate([clip, silence(1.0)])) if isinstance(e, Utterance)
    ]
    assert utterance.start_ms == 0 and utterance.end_ms >= clip.size * 1000 // SR


def test_a_flushed_tail_shorter_than_a_frame_counts_on_the_stream_clock(speech: Any) -> None:
    """A commit's utterance keeps the audio not yet framed (under 30 ms), and the clock counts it: the
    times stay those of the audio received, commit after commit (a review: 55 ms behind after 6)."""
    clip = speech("weather").audio16k
    segmenter = VadSegmenter()
    received = 0
    for n in range(6):
        piece = clip[: clip.size - clip.size % 480 - 480 + 80 + 16 * n]  # a whole number of frames, then 5-10 ms
        feed(segmenter, piece)
        received += piece.size
        flushed = segmenter.flush()
        assert isinstance(flushed, Utterance), n
        assert flushed.end_ms == received * 1000 // SR, (n, flushed.end_ms, received)
    assert segmenter.position_ms == received * 1000 // SR


def test_chunk_size_does_not_change_the_result(speech: Any) -> None:
    audio = np.concatenate([silence(0.5), speech("remind").audio16k, silence(1.0)])
    results = []
    for chunk in (160, 333, 4096):
        events = feed(VadSegmenter(), audio, chunk)
        results.append([(type(e).__name__, getattr(e, "start_ms", None), getattr(e, "end_ms", None)) for e in events])
    assert results[0] == results[1] == results[2]


def test_broadband_noise_is_voiced_for_webrtcvad() -> None:
    """Documents why the engine adds a neural VAD: webrtcvad alone calls loud noise speech."""
    events = feed(VadSegmenter(), np.concatenate([noise(2.0, 0.3), silence(1.0)]))
    assert any(isinstance(e, Utterance) for e in events)


def test_skipped_audio_counts_on_the_stream_clock(speech: Any) -> None:
    """Audio a wake-word gate held back moves the clock (times stay comparable with the
    connection's audio), between utterances only, to the millisecond over many small pieces."""
    clip = speech("kitchen").audio16k
    segmenter = VadSegmenter(SegmenterConfig(hangover_ms=500, preroll_ms=300))
    for _ in range(100):
        segmenter.skip(SR * 20 // 1000 + 3)  # 20 ms and 3 samples, a hundred times
    assert segmenter.position_ms == 2018  # 2000 ms + 300 samples (18.75 ms), whole milliseconds
    events = feed(segmenter, np.concatenate([clip, silence(1.0)]))
    [utterance] = [e for e in events if isinstance(e, Utterance)]
    assert utterance.start_ms >= 2018
    feed(segmenter, clip[: clip.size * 2 // 3])
    assert segmenter.in_speech
    before = segmenter.position_ms
    segmenter.skip(SR)  # in speech: the clock does not jump inside an utterance
    assert segmenter.position_ms == before


class Marking:
    """A gate that lets every frame count and marks every ``every``-th frame it is asked about (0:
    none) as one its rule would have held (``SpeechGate.last_suspect``), with ``restart`` as one just
    after the device's playback started afresh too (``SpeechGate.last_restart``)."""

    def __init__(self, every: int, restart: bool = False) -> None:
        self.every, self.restart, self.asked = every, restart, 0
        self.last_suspect = self.last_restart = False

    def __call__(self, frame: np.ndarray, after: int = 0, voiced: bool = True, speaking: bool = False) -> bool:
        self.asked += 1
        self.last_suspect = self.every > 0 and self.asked % self.every == 0
        self.last_restart = self.last_suspect and self.restart
        return True


def test_a_start_is_suspect_when_most_of_its_voiced_frames_were_marked(speech: Any) -> None:
    """``SpeechStart.suspect``: more than half of the voiced frames that started it were frames the
    gate marked (all of them here), not when it marked none."""
    audio = np.concatenate([silence(1.0), speech("kitchen").audio16k, silence(1.0)])
    for every, suspect in ((1, True), (0, False)):
        segmenter = VadSegmenter(SegmenterConfig(hangover_ms=500, preroll_ms=300))
        segmenter.gate = Marking(every)
        [start] = [e for e in feed(segmenter, audio) if isinstance(e, SpeechStart)]
        assert start.suspect is suspect, every
