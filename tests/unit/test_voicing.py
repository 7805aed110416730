"""Is the sound a voice (mediaserver/speakers/voicing.py): real people and Piper are, noise and steady tones are not."""

from __future__ import annotations

import numpy as np
import pytest

from mediaserver.speakers.encoder import MIN_SAMPLES, voiced_seconds
from mediaserver.speakers.voicing import voiced_share
from tests.conftest import synthesize

SECONDS = 5
T = np.arange(SECONDS * 16000) / 16000
RNG = np.random.default_rng(7)


def _brown() -> np.ndarray:
    walk = np.cumsum(RNG.standard_normal(T.size))
    return walk - np.convolve(walk, np.ones(801) / 801, "same")


NOT_VOICES = {
    "white noise": RNG.standard_normal(T.size),
    "brown noise": _brown(),
    "mains hum 100 Hz with noise": np.sin(2 * np.pi * 100 * T) + 0.1 * RNG.standard_normal(T.size),
    "hum 50 Hz and its harmonic": np.sin(2 * np.pi * 50 * T) + 0.3 * np.sin(2 * np.pi * 150 * T),
    "a 1 kHz beep": np.sin(2 * np.pi * 1000 * T),
    "a 120 Hz buzzer": np.sign(np.sin(2 * np.pi * 120 * T)),
}


@pytest.mark.parametrize("name", list(NOT_VOICES))
def test_noise_and_steady_tones_are_no_voice(name: str) -> None:
    audio = NOT_VOICES[name]
    share = voiced_share((0.3 * audio / np.abs(audio).max()).astype(np.float32))
    assert share is None or share < 0.2, (name, share)


def test_no_tone_from_60_hz_to_1_5_khz_is_a_voice() -> None:
    # A review swept them: a first rule, on the pitch periods, let 24 of 35 sines of 60-400 Hz and a
    # 440 Hz beep through (a tone's period is picked among its repeats).
    passed = []
    for hertz in [*range(60, 401, 10), 440, 523, 880, 1000, 1500]:
        for shape, wave in (
            ("sine", np.sin(2 * np.pi * hertz * T)),
            ("square", np.sign(np.sin(2 * np.pi * hertz * T))),
            ("sawtooth", 2 * ((hertz * T) % 1) - 1),
        ):
            share = voiced_share((0.3 * wave).astype(np.float32))
            if share is not None and share >= 0.2:
                passed.append((hertz, shape, share))
    assert passed == []


def test_real_speech_cut_in_pieces_stays_a_voice(human_clips: list[tuple[str, np.ndarray, str]]) -> None:
    seconds = 1.5  # pieces with at least the encoder's 1.2 s of speech, as a stream's utterances are
    refused = [
        (name, start)
        for name, audio, _ in human_clips
        for start in range(0, audio.size - int(seconds * 16000), int(seconds * 16000))
        if voiced_seconds(piece := audio[start : start + int(seconds * 16000)]) * 16000 >= MIN_SAMPLES
        and (voiced_share(piece) or 0.0) < 0.2
    ]
    assert refused == []


def test_real_people_and_piper_are_voices(human_clips: list[tuple[str, np.ndarray, str]]) -> None:
    shares = {name: voiced_share(audio) for name, audio, _ in human_clips}
    shares |= {text: voiced_share(synthesize(text).audio16k) for text in ("Stop.", "Turn on the kitchen lights.")}
    assert all(share is not None and share >= 0.35 for share in shares.values()), shares


def test_silence_nan_and_long_audio() -> None:
    assert voiced_share(np.zeros(16000, np.float32)) is None
    assert voiced_share(np.zeros(100, np.float32)) is None  # shorter than a frame
    assert voiced_share(np.full(16000, np.nan, np.float32)) is None
    hour = np.tile((0.1 * RNG.standard_normal(16000)).astype(np.float32), 3600)  # only its first minute is read
    assert voiced_share(hour) == 0.0
