"""What one Wyoming ``transcribe`` cycle holds (wyoming/server.py's connections): its audio, as runs
of identically formatted PCM checked against the utterance's limits; the prompt its
``transcript_names`` / ``transcript_terms`` give Whisper; its transcript cut into chunks; and the
audio every connection of a server holds at once (``wyoming_max_buffered_audio_bytes``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mediaserver.asr.vocabulary import check_prompt
from mediaserver.audio.decode import PcmFormat, pcm_to_float
from mediaserver.config import Settings
from mediaserver.errors import AudioTooLarge, InvalidAudio, InvalidParameter, Overloaded
from mediaserver.events import AudioArray, Transcript


def format_field(data: dict[str, Any], key: str) -> int | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidAudio(f"Invalid audio: {key} must be an integer, got {value!r}")
    return value


def audio_format(data: dict[str, Any], fallback: PcmFormat | None) -> PcmFormat | None:
    """rate/width/channels from an audio event, missing fields taken from ``fallback``."""
    rate, width, channels = (format_field(data, key) for key in ("rate", "width", "channels"))
    if rate is None and width is None and channels is None:
        return fallback
    if fallback is not None:
        rate = fallback.sample_rate_hz if rate is None else rate
        width = fallback.bits // 8 if width is None else width
        channels = fallback.channels if channels is None else channels
    if rate is None or width is None or channels is None:
        raise InvalidAudio("Invalid audio: rate, width and channels are required before the first audio")
    fmt = PcmFormat(rate, width * 8, channels)
    fmt.validate()
    return fmt


@dataclass
class Utterance:
    """Audio of one transcribe cycle, kept as runs of identically formatted PCM."""

    model: str | None
    language: str | None
    fmt: PcmFormat | None = None
    prompt: str | None = None  # from transcribe's transcript_names / transcript_terms
    runs: list[tuple[PcmFormat, bytearray]] = field(default_factory=list)
    total_bytes: int = 0
    duration_s: float = 0.0

    def add(self, fmt: PcmFormat, pcm: bytes, *, max_bytes: int, max_duration_s: float) -> None:
        self.total_bytes += len(pcm)
        self.duration_s += len(pcm) / fmt.frame_bytes / fmt.sample_rate_hz
        if self.total_bytes > max_bytes:
            raise AudioTooLarge(f"audio exceeds the limit of {max_bytes} bytes")
        if self.duration_s > max_duration_s:
            raise AudioTooLarge(f"audio is longer than the limit of {max_duration_s:.0f} s")
        if self.runs and self.runs[-1][0] == fmt:
            self.runs[-1][1].extend(pcm)
        else:
            self.runs.append((fmt, bytearray(pcm)))

    def to_float(self, max_duration_s: float) -> AudioArray:
        parts = [
            pcm_to_float(bytes(pcm), fmt, max_duration_s=max_duration_s)
            for fmt, pcm in self.runs
            if len(pcm) >= fmt.frame_bytes
        ]
        return np.concatenate(parts).astype(np.float32, copy=False) if parts else np.zeros(0, np.float32)


_BIAS_FIELDS = ("transcript_terms", "transcript_names")


def transcribe_prompt(data: Mapping[str, Any], settings: Settings) -> str | None:
    """The prompt of a ``transcribe``: its ``transcript_terms`` then its ``transcript_names`` (the
    ``wyoming`` package's fields of words that "should bias the ASR transcription", names taking
    priority over terms), joined with ", ", names last, nearest the audio, where Whisper weighs them
    most and where a prompt cut to Whisper's 223 tokens keeps them. Lists of strings (null: none);
    the whole is bound as every face's prompt is (``asr/vocabulary.py``)."""
    words: list[str] = []
    present: list[str] = []
    for key in _BIAS_FIELDS:
        value = data.get(key)
        if value is None:
            continue
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise InvalidParameter(f"transcribe {key} must be a list of strings, got {value!r:.80}", param=key)
        words += [v.strip() for v in value if v.strip()]
        present.append(key)
    if not words:
        return None
    return check_prompt(", ".join(words), settings, "transcribe " + " and ".join(present))


def transcript_chunks(transcript: Transcript) -> list[str]:
    """Segment texts trimmed so that they concatenate to exactly ``transcript.text``."""
    texts = [s.text for s in transcript.segments if s.text]
    if texts:
        texts[0] = texts[0].lstrip()
        texts[-1] = texts[-1].rstrip()
        texts = [t for t in texts if t]
    if "".join(texts) != transcript.text:
        return [transcript.text] if transcript.text else []
    return texts


class AudioBufferFull(Overloaded):
    code = "audio_buffer_full"


class AudioBudget:
    """Audio bytes held for transcription across every connection of a server."""

    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        self.used_bytes = 0

    def reserve(self, size: int) -> None:
        if self.used_bytes + size > self.limit_bytes:
            raise AudioBufferFull(
                f"the server already holds {self.used_bytes} bytes of audio for transcription "
                f"(wyoming_max_buffered_audio_bytes = {self.limit_bytes}); retry later"
            )
        self.used_bytes += size

    def release(self, size: int) -> None:
        self.used_bytes = max(0, self.used_bytes - size)
