"""What a stream is asked to do (``StreamOptions``), its segmenter's configuration, and what the
stream's parts (``finals``, ``partials``) read of their session (``StreamParent``). They sit below
``session`` so that those parts need not import the session that owns them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol

from mediaserver.asr.service import AsrService
from mediaserver.audio.segmenter import SegmenterConfig
from mediaserver.config import Settings
from mediaserver.events import TranscriptionOptions


@dataclass(frozen=True)
class StreamOptions:
    model: str | None = None
    transcription: TranscriptionOptions = field(
        default_factory=lambda: TranscriptionOptions(with_segment_timestamps=False)
    )
    server_vad: bool = False
    partials: bool = False
    # Partials also carry the latest hypothesis' words after the agreed ones (may change), and are
    # sent whenever those change: words on screen one decode after the speech, not three.
    unstable_partials: bool = False
    # How a server-VAD utterance ends: "silence" (the hangover), "semantic" (the turn model scores
    # each pause; unfinished turns wait up to the eagerness cap); None = the turn_detection setting.
    turn_detection: Literal["silence", "semantic"] | None = None
    eagerness: Literal["low", "medium", "high", "auto"] | None = None


def segmenter_config(settings: Settings, **overrides: int | float) -> SegmenterConfig:
    values: dict[str, int | float] = {
        "aggressiveness": settings.stream_vad_aggressiveness,
        "hangover_ms": settings.stream_vad_hangover_ms,
        "preroll_ms": settings.stream_vad_preroll_ms,
        "min_speech_ms": settings.stream_min_speech_ms,
        "max_utterance_s": settings.stream_max_utterance_s,
        "warmup_ms": settings.stream_vad_warmup_ms,
    }
    values.update(overrides)
    return SegmenterConfig(**values)  # type: ignore[arg-type]


class StreamParent(Protocol):
    """What a stream's parts (``Finals``, ``Partials``) read of their session (``StreamSession``)."""

    id: str
    asr: AsrService
    settings: Settings

    @property
    def options(self) -> StreamOptions: ...
