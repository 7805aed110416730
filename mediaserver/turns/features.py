"""The input Smart Turn v3 was trained on: Whisper's log-mel spectrogram of the last 8 s.

The model (a Whisper-tiny encoder and a classifier) reads 80 mel bands x 800 frames: 8 s of 16 kHz
audio, the most recent 8 s when the turn is longer, zero samples *before* the speech when it is
shorter (the speech always ends at the right edge, where the model looks for the end of a turn).
The window is normalised to zero mean and unit variance as a whole (the padding included), then
turned into Whisper's features: a centred 400-point STFT (periodic Hann window, 160-sample hop,
reflected edges), power spectrum, 80 Slaney-scale mel filters with Slaney area normalisation over
0-8 kHz, log10 floored at 1e-10, the last frame dropped (801 -> 800), values clamped to 8 below the
window's maximum and mapped by (x + 4) / 4. This is what Hugging Face's ``WhisperFeatureExtractor``
(``chunk_length=8``, ``do_normalize=True``) computes and what pipecat feeds the model; a feature
that differs (padding at the end, per-frame normalisation) moves the scores far more than it seems.
"""

from __future__ import annotations

import functools
from typing import Final

import numpy as np
import numpy.typing as npt

SAMPLE_RATE_HZ: Final = 16_000
WINDOW_S: Final = 8
WINDOW_SAMPLES: Final = SAMPLE_RATE_HZ * WINDOW_S
N_FFT: Final = 400
HOP: Final = 160
N_MELS: Final = 80
FRAMES: Final = WINDOW_SAMPLES // HOP  # 800

Features = npt.NDArray[np.float32]


def last_window(audio: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    """The last 8 s of ``audio``, zero-padded at the start to exactly 8 s."""
    audio = np.asarray(audio, dtype=np.float32).reshape(-1)
    if audio.size >= WINDOW_SAMPLES:
        return audio[-WINDOW_SAMPLES:]
    return np.concatenate([np.zeros(WINDOW_SAMPLES - audio.size, np.float32), audio])


def _slaney_mel(hz: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    # Linear below 1 kHz (3 mels per 200 Hz), logarithmic above (27 mels per factor 6.4).
    return np.where(hz < 1000.0, hz * 3.0 / 200.0, 15.0 + np.log(np.maximum(hz, 1e-9) / 1000.0) * 27.0 / np.log(6.4))


def _slaney_hz(mel: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    return np.where(mel < 15.0, mel * 200.0 / 3.0, 1000.0 * np.exp((mel - 15.0) * np.log(6.4) / 27.0))


@functools.cache
def mel_filters() -> npt.NDArray[np.float64]:
    """(80, 201): triangular filters between 82 points evenly spaced in Slaney mels over 0-8 kHz,
    each scaled by 2 / its bandwidth in Hz (equal area)."""
    edges = _slaney_hz(np.linspace(0.0, float(_slaney_mel(np.array(SAMPLE_RATE_HZ / 2.0))), N_MELS + 2))
    bins = np.linspace(0.0, SAMPLE_RATE_HZ / 2.0, N_FFT // 2 + 1)
    lower, centre, upper = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    rising = (bins[None, :] - lower) / (centre - lower)
    falling = (upper - bins[None, :]) / (upper - centre)
    triangles = np.clip(np.minimum(rising, falling), 0.0, None)
    return triangles * (2.0 / (upper - lower))


@functools.cache
def _hann() -> npt.NDArray[np.float64]:
    n = np.arange(N_FFT)
    return 0.5 - 0.5 * np.cos(2.0 * np.pi * n / N_FFT)  # periodic: the period is N_FFT, not N_FFT - 1


def log_mel(audio: npt.NDArray[np.float32]) -> Features:
    """(80, 800) features of the last 8 s of 16 kHz ``audio`` (any length)."""
    window = last_window(audio)
    normalised = (window - window.mean()) / np.sqrt(window.var() + 1e-7)
    padded = np.pad(normalised.astype(np.float64), N_FFT // 2, mode="reflect")
    frames = np.lib.stride_tricks.sliding_window_view(padded, N_FFT)[::HOP]  # (801, 400)
    power = np.abs(np.fft.rfft(frames * _hann(), axis=-1)) ** 2  # (801, 201)
    mel = np.log10(np.maximum(mel_filters() @ power.T, 1e-10))[:, :FRAMES]  # (80, 800)
    mel = np.maximum(mel, mel.max() - 8.0)
    features: Features = ((mel + 4.0) / 4.0).astype(np.float32)
    return features
