"""Noise suppression and automatic gain for a stream, before the VAD and ASR: the WebRTC audio
processing module (``webrtc-noise-gain``, as wyoming-satellite uses it), 10 ms frames at 16 kHz.

Off by default (``noise_default``). What it does to Whisper's accuracy depends on the noise (see
``tools/bench_noise.py`` and tools/README.md): it helps on stationary noise (white noise, fans,
hum) at low SNR, leaves clean speech about unchanged, and **hurts on babble** (other voices), which
it partly treats as speech and partly smears. A stream turns it on with a start option
(``noise_suppression``: true, false or a level 1..4) or, on OpenAI Realtime,
``input_audio_noise_reduction`` / ``audio.input.noise_reduction`` (``near_field`` and ``far_field``
map to ``noise_near_field_level`` and ``noise_far_field_level``).

A ``NoiseFilter`` lives as long as its stream: the suppressor learns the noise floor over the
first few hundred milliseconds and keeps adapting. Up to 10 ms of audio (an incomplete frame) is
held until the next piece arrives.
"""

from __future__ import annotations

from typing import Any, Final

import numpy as np

from mediaserver.config import Settings
from mediaserver.errors import InvalidParameter
from mediaserver.events import SAMPLE_RATE_HZ, AudioArray

FRAME_SAMPLES: Final = SAMPLE_RATE_HZ // 100  # 10 ms
MAX_LEVEL: Final = 4
REALTIME_TYPES: Final = ("near_field", "far_field")


class NoiseFilter:
    """WebRTC noise suppression (``level`` 1..4) and automatic gain (``auto_gain_dbfs``, 0 = off)."""

    def __init__(self, level: int, auto_gain_dbfs: int) -> None:
        from webrtc_noise_gain import AudioProcessor

        if not 1 <= level <= MAX_LEVEL:
            raise ValueError(f"noise suppression level must be 1..{MAX_LEVEL}, got {level}")
        self.level = level
        self.auto_gain_dbfs = auto_gain_dbfs
        self._processor: Any = AudioProcessor(auto_gain_dbfs, level)
        self._carry = np.zeros(0, np.int16)

    def process_pcm16(self, pcm: np.ndarray) -> np.ndarray:
        """16 kHz mono int16 → the same, cleaned; whole 10 ms frames out, the rest held."""
        data = np.concatenate([self._carry, pcm]) if self._carry.size else pcm
        usable = data.size - data.size % FRAME_SAMPLES
        self._carry = data[usable:].copy()
        if usable == 0:
            return np.zeros(0, np.int16)
        raw = data[:usable].astype("<i2").tobytes()
        out = bytearray()
        step = FRAME_SAMPLES * 2
        for start in range(0, len(raw), step):
            out += self._processor.Process10ms(raw[start : start + step]).audio
        return np.frombuffer(bytes(out), dtype="<i2")

    def process(self, samples: AudioArray) -> AudioArray:
        """16 kHz mono float32 (the session pipeline's form) → cleaned float32."""
        pcm = (np.clip(samples, -1.0, 1.0) * 32767.0).astype(np.int16)
        return (self.process_pcm16(pcm).astype(np.float32) / 32768.0).astype(np.float32)

    def reset(self) -> None:
        """A new recording: forget the held partial frame (the noise estimate carries on)."""
        self._carry = np.zeros(0, np.int16)


def new_filter(level: int, settings: Settings) -> NoiseFilter | None:
    """The filter for a stream at ``level`` (0 = none)."""
    return NoiseFilter(level, settings.noise_auto_gain_dbfs) if level > 0 else None


def parse_level(value: object, settings: Settings, *, param: str = "noise_suppression") -> int:
    """A start option → a level (0 = off): true/false, "true"/"false"/"on"/"off", 0..4,
    "near_field"/"far_field"; None = the server's default (``noise_default``)."""
    if value is None:
        return settings.noise_suppression_level if settings.noise_default else 0
    if isinstance(value, bool):
        return settings.noise_suppression_level if value else 0
    if isinstance(value, int) and 0 <= value <= MAX_LEVEL:
        return value
    if isinstance(value, str):
        text = value.strip().lower()
        # A level, as the JSON number is ("1": level 1); ASCII digits only ("²" is a digit to isdigit).
        if text.isascii() and text.isdigit() and 0 <= int(text) <= MAX_LEVEL:
            return int(text)
        if text in ("true", "on", "yes"):
            return settings.noise_suppression_level
        if text in ("false", "off", "no", "none"):
            return 0
        if text in REALTIME_TYPES:
            return realtime_level(text, settings)
    raise InvalidParameter(
        f"{param} must be true, false, a level from 0 to {MAX_LEVEL}, 'near_field' or 'far_field'; got {value!r}",
        param=param,
    )


def realtime_level(noise_type: str | None, settings: Settings) -> int:
    """OpenAI Realtime's ``noise_reduction.type`` → a level (None, i.e. a null noise_reduction = off)."""
    if noise_type == "near_field":
        return settings.noise_near_field_level
    if noise_type == "far_field":
        return settings.noise_far_field_level
    return 0
