"""Is the sound a voice? The share of the VAD's speech frames that are voiced (pitched).

webrtcvad, which cuts the silences before a voice is embedded (encoder.py), calls steady noise
speech: white noise was 4.98 s of "speech" in 5 s, and a user trial enrolled it as a speaker,
whom any other noise then matched (0.996, so WIS ``voice_auth`` authorized hiss). A voice has a
pitch: in most of its speech frames the waveform repeats every 2.5-25 ms (60-400 Hz), and its
autocorrelation has a clear peak there. Noise has none.

Per 30 ms frame the VAD calls speech, the normalized autocorrelation is searched after its first
zero crossing (noise whose energy sits at low frequencies, brown noise or mains hum, stays
correlated over short lags without repeating) for an inner peak between 40 and 267 samples; a
frame whose peak is at least ``PEAK`` is voiced. Measured on the suite's 17 real recordings
(tests/human_speech.py): 0.41-0.83 of their speech frames are voiced; the same with white noise at
0 dB SNR over the whole clip, 0.23-0.26; white and pink noise 0.00, brown 0.02-0.12, a car's
rumble 0.03. Hence ``speaker_min_voiced_share`` 0.2. A steady tone (mains hum at 100 Hz, a beep, a
buzzer) is voiced throughout, but it is one sound: a clip whose speech frames' spectra are all
alike (``_steady``) is no voice (code reviews found hum, beeps and buzzers scoring 1.0). Written
here because no dependency of the server's has a pitch tracker (a YIN from librosa or praat would
be a large one for this).
"""

from __future__ import annotations

from typing import Final

import numpy as np
import numpy.typing as npt
import webrtcvad

SAMPLE_RATE: Final = 16_000
FRAME: Final = SAMPLE_RATE * 30 // 1000  # webrtcvad's 30 ms frames
MIN_LAG: Final = SAMPLE_RATE // 400  # 400 Hz
MAX_LAG: Final = SAMPLE_RATE * 10 // 600  # 60 Hz (266 samples, within one frame)
PEAK: Final = 0.5  # normalized autocorrelation at the pitch period that makes a frame voiced
TARGET_DBFS: Final = -30.0  # quieter audio is raised to this first, as the encoder's is
MAX_ANALYSED_S: Final = 60.0  # a clip's first minute tells (memory and CPU stay bounded: 18 ms per 10 s)
BLOCK_FRAMES: Final = 1000  # 30 s of frames analysed at once
STEADY_LIKENESS: Final = 0.95  # frames whose spectra are this like their mean (median) are one sound: a tone
MIN_STEADY_FRAMES: Final = 3  # a tone's frames the VAD calls speech may be few (its onset); fewer tell nothing


def voiced_share(audio: npt.ArrayLike) -> float | None:
    """The share of ``audio``'s (16 kHz mono float; its first ``MAX_ANALYSED_S``) speech frames, as
    webrtcvad finds them, that are voiced; 0 for a steady tone (a hum, a beep: every frame's spectrum
    alike, where a voice's changes with every sound); None when it finds no speech at all."""
    wav = np.nan_to_num(np.asarray(audio, dtype=np.float32).ravel()[: int(MAX_ANALYSED_S * SAMPLE_RATE)])
    frames = wav.size // FRAME
    if frames == 0:
        return None
    rms = float(np.sqrt(np.mean(np.square(wav, dtype=np.float64))))
    gain = max(10 ** (TARGET_DBFS / 20) / rms if rms > 0 else 1.0, 1.0)
    vad = webrtcvad.Vad(3)
    speech_frames = 0
    voiced_frames = 0
    spectra: list[np.ndarray] = []  # the speech frames' magnitude spectra, each of unit norm
    for first in range(0, frames, BLOCK_FRAMES):
        count = min(BLOCK_FRAMES, frames - first)
        block = wav[first * FRAME : (first + count) * FRAME].reshape(count, FRAME) * gain
        pcm = (np.clip(block, -1.0, 1.0) * 32767).round().astype("<i2")
        speech = np.array([vad.is_speech(frame.tobytes(), SAMPLE_RATE) for frame in pcm], bool)
        speech_frames += int(np.count_nonzero(speech))
        if speech.any():
            voiced_frames += int(np.count_nonzero(_voiced(block[speech])))
            magnitude = np.abs(np.fft.rfft(block[speech] * np.hanning(FRAME), axis=1))
            spectra.append(magnitude / (np.linalg.norm(magnitude, axis=1, keepdims=True) + 1e-12))
    if speech_frames == 0:
        return None
    if spectra and sum(block.shape[0] for block in spectra) >= MIN_STEADY_FRAMES and _steady(spectra):
        return 0.0  # one sound throughout: a tone
    return voiced_frames / speech_frames


def _steady(spectra: list[np.ndarray]) -> bool:
    """Whether the speech frames' spectra (each of unit norm) are all alike: a hum, a beep, a buzzer
    sound the same in every frame (median likeness to their mean 0.989-1.0 over sines, squares and
    sawtooths of 60-1500 Hz), where a voice's change with every sound (0.86 at most over the suite's
    real recordings). (A first rule on the pitch periods, a review found, missed most tones: their
    period is picked among its repeats, 123 or 247 samples for one 130 Hz tone.)"""
    frames = np.concatenate(spectra)
    mean = frames.mean(axis=0)
    norm = float(np.linalg.norm(mean))
    return norm > 0 and float(np.median(frames @ (mean / norm))) >= STEADY_LIKENESS


def _voiced(frames: np.ndarray) -> np.ndarray:
    """Which frames are voiced: an inner autocorrelation peak of at least ``PEAK`` at a pitch period."""
    centred = frames - frames.mean(axis=1, keepdims=True)
    spectrum = np.fft.rfft(centred, n=2 * FRAME + 64, axis=1)
    correlation = np.fft.irfft(np.abs(spectrum) ** 2, axis=1)[:, :FRAME]
    lags = np.arange(FRAME)
    # Normalized by the energy, each lag scaled for the samples it overlaps (unbiased).
    normalized = correlation / (correlation[:, :1] + 1e-12) * (FRAME / (FRAME - lags))
    negative = normalized < 0
    first_zero = np.where(negative.any(axis=1), negative.argmax(axis=1), FRAME)
    start = np.maximum(first_zero, MIN_LAG)
    searched = (lags[None, :] >= start[:, None]) & (lags[None, :] < MAX_LAG)
    masked = np.where(searched, normalized, -np.inf)
    peak_lag = masked.argmax(axis=1)
    inner = (peak_lag > start) & (peak_lag < MAX_LAG - 1)
    result: np.ndarray = inner & (masked.max(axis=1) >= PEAK)
    return result
