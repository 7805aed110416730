"""Typed values of speech synthesis: what a request asks for and what comes out.

Small frozen dataclasses, as in ``mediaserver/events.py``: a chunk handed from the worker thread to
a transport cannot change on the way, and transports never see an engine's own types.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt

Pcm16 = npt.NDArray[np.int16]


@dataclass(frozen=True)
class SynthesisParams:
    """Everything besides the text and the voice that changes the audio (and so the cache key).

    ``speed`` 1.0 is the voice's own pace, 2.0 twice as fast. ``speaker`` picks a speaker of a
    multi-speaker voice.
    """

    speed: float = 1.0
    speaker: str | None = None


@dataclass(frozen=True)
class VoiceInfo:
    """One voice the server can speak with."""

    name: str
    engine: str
    language: str  # as the voice declares it: en_US, de_DE ...
    sample_rate_hz: int
    model_path: Path
    config_path: Path
    source: str  # "bundled", "voices_dir" or "downloaded"
    description: str = ""
    speakers: tuple[str, ...] = ()
    quality: str = ""

    @property
    def language_tag(self) -> str:
        """BCP 47 style (``en-US``), as Home Assistant and browsers name languages."""
        return self.language.replace("_", "-")


@dataclass(frozen=True)
class TtsChunk:
    """Audio of one sentence (or a part of one): mono signed 16-bit little-endian PCM.

    ``sentence_index`` counts the request's sentences from 0; ``sentence`` is the text spoken.
    """

    pcm: bytes
    sample_rate_hz: int
    sentence: str
    sentence_index: int
    voice: str = ""
    synth_time_s: float = 0.0

    @property
    def samples(self) -> int:
        return len(self.pcm) // 2

    @property
    def duration_s(self) -> float:
        return self.samples / self.sample_rate_hz if self.sample_rate_hz else 0.0

    def as_array(self) -> Pcm16:
        """The samples as a read-only int16 array (no copy)."""
        return np.frombuffer(self.pcm, dtype="<i2")


@dataclass(frozen=True)
class SpeechResult:
    """A whole synthesis: all sentences joined."""

    pcm: bytes
    sample_rate_hz: int
    voice: str
    sentences: tuple[str, ...] = field(default_factory=tuple)
    first_audio_s: float = 0.0

    @property
    def duration_s(self) -> float:
        return len(self.pcm) / 2 / self.sample_rate_hz if self.sample_rate_hz else 0.0
