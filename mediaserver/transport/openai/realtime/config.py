"""Realtime session configuration, typed: the input format, the turn detection and the whole
``RealtimeConfig`` a session runs, and how each is described in ``session.created`` /
``session.updated`` (GA and beta shapes). ``session_update.py`` parses a ``session.update`` into one.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Final, Literal

from mediaserver.audio.decode import PcmFormat
from mediaserver.audio.echo import EchoMode
from mediaserver.audio.segmenter import SegmenterConfig
from mediaserver.audio.stream_decode import G711StreamDecoder, PcmStreamDecoder, StreamDecoder
from mediaserver.config import Settings
from mediaserver.events import TranscriptionOptions
from mediaserver.stream.options import StreamOptions, segmenter_config

MIN_SILENCE_MS: Final = 60  # two 30 ms VAD frames: the shortest hangover the segmenter runs

LOGPROBS_INCLUDE: Final = "item.input_audio_transcription.logprobs"
AudioType = Literal["audio/pcm", "audio/pcmu", "audio/pcma"]
TurnType = Literal["server_vad", "semantic_vad"]
BETA_FORMATS: Final[dict[str, AudioType]] = {
    "pcm16": "audio/pcm",
    "g711_ulaw": "audio/pcmu",
    "g711_alaw": "audio/pcma",
}
_EAGERNESS_SILENCE_MS: Final = {"low": 1000, "high": 300}
_EAGERNESS_LEVELS: Final[tuple[Literal["low", "medium", "high", "auto"], ...]] = ("low", "medium", "high", "auto")


@dataclass(frozen=True)
class InputFormat:
    type: AudioType = "audio/pcm"
    rate_hz: int = 24000

    @property
    def is_pcm(self) -> bool:
        return self.type == "audio/pcm"

    @property
    def bytes_per_sample(self) -> int:
        return 2 if self.is_pcm else 1

    def ga(self) -> dict[str, Any]:
        return {"type": self.type, "rate": self.rate_hz} if self.is_pcm else {"type": self.type}

    def decoder(self) -> StreamDecoder:
        """A decoder for appended audio; a PCM16 append of an odd byte count keeps it for the next."""
        if self.is_pcm:
            return PcmStreamDecoder(PcmFormat(self.rate_hz, 16, 1), carry_partial=True)
        return G711StreamDecoder("ulaw" if self.type == "audio/pcmu" else "alaw")

    def beta(self) -> str | dict[str, Any]:
        if self.is_pcm and self.rate_hz != 24000:
            return self.ga()
        return next(name for name, kind in BETA_FORMATS.items() if kind == self.type)


@dataclass(frozen=True)
class TurnDetection:
    """Server VAD settings; ``None`` fields keep the server's ``stream_vad_*`` settings."""

    type: TurnType = "server_vad"
    threshold: float | None = None
    prefix_padding_ms: int | None = None
    silence_duration_ms: int | None = None
    eagerness: str | None = None
    # Conversation sessions: answer each turn by itself, and stop an answer when the user speaks.
    create_response: bool = True
    interrupt_response: bool = True
    # Conversation sessions: commit and answer after this much input audio without speech (session.py).
    idle_timeout_ms: int | None = None

    def aggressiveness(self, settings: Settings) -> int:
        """The webrtcvad aggressiveness in force: ``threshold`` 0..1 maps onto its four levels
        (``int(threshold * 4)``, 1.0 is 3); none set keeps ``stream_vad_aggressiveness``."""
        if self.threshold is None:
            return settings.stream_vad_aggressiveness
        return min(3, int(self.threshold * 4))

    def silence_ms(self, settings: Settings) -> int:
        """The segmenter's hangover in force: ``silence_duration_ms`` (at least 60 ms, two VAD
        frames), or for ``semantic_vad`` without one the eagerness's silence (low 1000, high 300:
        what ends a turn when the turn model is not loaded; with it, the eagerness cap replaces
        it), else ``stream_vad_hangover_ms``."""
        silence_ms = self.silence_duration_ms
        if silence_ms is None and self.type == "semantic_vad":
            silence_ms = _EAGERNESS_SILENCE_MS.get(self.eagerness or "auto")
        return settings.stream_vad_hangover_ms if silence_ms is None else max(MIN_SILENCE_MS, silence_ms)

    def prefix_ms(self, settings: Settings) -> int:
        return settings.realtime_prefix_padding_ms if self.prefix_padding_ms is None else self.prefix_padding_ms

    def segmenter(self, settings: Settings) -> SegmenterConfig:
        # Every detected start of speech becomes an item, as with OpenAI: no minimum speech length.
        return segmenter_config(
            settings,
            min_speech_ms=0,
            hangover_ms=self.silence_ms(settings),
            preroll_ms=self.prefix_ms(settings),
            aggressiveness=self.aggressiveness(settings),
        )

    def describe(self, settings: Settings, *, conversation: bool = False) -> dict[str, Any]:
        """What runs, in OpenAI's fields: sending it back changes nothing (docs/realtime.md).

        ``threshold`` is the level of the aggressiveness in force (0, 0.25, 0.5 or 0.75: what
        ``aggressiveness`` maps back to itself). ``semantic_vad`` has no ``silence_duration_ms`` in
        OpenAI's shape, and none runs while the turn model ends turns, so it is shown only when the
        client set one (it then ends turns if the turn model is not loaded)."""
        described: dict[str, Any] = {"type": self.type}
        if self.type == "semantic_vad":
            described["eagerness"] = self.eagerness or "auto"
        described.update(threshold=self.aggressiveness(settings) / 4, prefix_padding_ms=self.prefix_ms(settings))
        if self.type == "server_vad" or self.silence_duration_ms is not None:
            described["silence_duration_ms"] = self.silence_ms(settings)
        if conversation:
            described.update(create_response=self.create_response, interrupt_response=self.interrupt_response)
            described["idle_timeout_ms"] = self.idle_timeout_ms
        return described


@dataclass(frozen=True)
class RealtimeConfig:
    """A session's effective configuration (what ``session.updated`` describes)."""

    model: str  # the name clients see: what they asked for, or the server's default
    resolved_model: str  # the registry's name for it
    input_format: InputFormat = InputFormat()
    language: str | None = "en"
    prompt: str | None = None
    turn_detection: TurnDetection | None = field(default_factory=TurnDetection)
    include: tuple[str, ...] | None = None
    noise_reduction: str | None = None  # "near_field" / "far_field": WebRTC suppression (audio/noise.py)
    # An extension: the server's canceller of the answers it speaks over the socket (audio/echo.py):
    # "auto" = on while the session's answers are audio sent as deltas (realtime/session.py).
    echo_cancellation: EchoMode = "off"
    # The client named a model of ours (not none, not an OpenAI name): it is kept whatever the
    # language; otherwise another language takes the multilingual fallback (translation_model).
    model_named: bool = False

    @property
    def server_vad(self) -> bool:
        return self.turn_detection is not None

    @property
    def logprobs(self) -> bool:
        """``include`` asks for the input transcription's logprobs (Whisper's word probabilities)."""
        return self.include is not None and LOGPROBS_INCLUDE in self.include

    def stream_options(self, settings: Settings) -> StreamOptions:
        transcription = TranscriptionOptions(
            language=self.language,
            beam_size=settings.default_beam_size,
            initial_prompt=self.prompt or None,
            with_segment_timestamps=False,
            word_timestamps=self.logprobs,  # (a word's probability comes with its timing)
        )
        # Partials are what delta events carry; a manual commit is transcribed in one go.
        vad = self.server_vad
        return self._turn_options(StreamOptions(self.resolved_model, transcription, server_vad=vad, partials=vad))

    def _turn_options(self, options: StreamOptions) -> StreamOptions:
        """semantic_vad is the turn model's end of turn (mediaserver/turns), with OpenAI's eagerness
        caps; server_vad is silence detection. Without the turn model semantic_vad falls back to
        silence detection, with the silence the eagerness maps to (TurnDetection.segmenter)."""
        detection = self.turn_detection
        if detection is None:
            return options
        if detection.type != "semantic_vad":
            return replace(options, turn_detection="silence")
        eagerness = detection.eagerness or "auto"
        levels = [e for e in _EAGERNESS_LEVELS if e == eagerness]
        return replace(options, turn_detection="semantic", eagerness=levels[0] if levels else "auto")

    def segmenter(self, settings: Settings) -> SegmenterConfig:
        return (self.turn_detection or TurnDetection()).segmenter(settings)

    def noise_reduction_object(self) -> dict[str, str] | None:
        return {"type": self.noise_reduction} if self.noise_reduction else None

    def _transcription(self) -> dict[str, Any]:
        return {"model": self.model, "language": self.language, "prompt": self.prompt or ""}

    def describe_ga(self, session_id: str, settings: Settings) -> dict[str, Any]:
        turn = self.turn_detection.describe(settings) if self.turn_detection is not None else None
        return {
            "type": "transcription",
            "id": session_id,
            "object": "realtime.transcription_session",
            "audio": {
                "input": {
                    "format": self.input_format.ga(),
                    "noise_reduction": self.noise_reduction_object(),
                    "echo_cancellation": self.echo_cancellation,
                    "transcription": self._transcription(),
                    "turn_detection": turn,
                }
            },
            "include": list(self.include) if self.include is not None else None,
        }

    def describe_beta(self, session_id: str, settings: Settings) -> dict[str, Any]:
        turn = self.turn_detection.describe(settings) if self.turn_detection is not None else None
        return {
            "id": session_id,
            "object": "realtime.transcription_session",
            "modalities": ["text"],
            "input_audio_format": self.input_format.beta(),
            "input_audio_transcription": self._transcription(),
            "turn_detection": turn,
            "input_audio_noise_reduction": self.noise_reduction_object(),
            "input_audio_echo_cancellation": self.echo_cancellation,
            "include": list(self.include) if self.include is not None else None,
        }
