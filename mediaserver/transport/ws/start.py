"""The device WebSocket's ``start`` message (or the query string that stands for one): the keys it
takes, their validation (``parse_start``) and the effective configuration it yields (``StreamConfig``,
echoed in ``ready``). ``asr.py`` applies a config to the connection; the wire protocol is in
``docs/ws-protocol.md``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Final, Literal

from mediaserver.asr.models import ModelRegistry
from mediaserver.assistant.client_tools import ClientTools, parse_client_tools
from mediaserver.audio.decode import PcmFormat
from mediaserver.audio.echo import EchoMode, parse_echo_option
from mediaserver.audio.noise import parse_level
from mediaserver.config import Settings
from mediaserver.errors import InvalidParameter
from mediaserver.events import SAMPLE_RATE_HZ
from mediaserver.stream.options import StreamOptions
from mediaserver.transport.common import parse_bool, parse_int, stream_options_from
from mediaserver.wake.gate import parse_wake_option

Encoding = Literal["pcm16", "float32"]
Mode = Literal["push_to_talk", "server_vad"]

MIN_SAMPLE_RATE_HZ: Final = 8000
MAX_SAMPLE_RATE_HZ: Final = 48000
MAX_CHANNELS: Final = 2

_ENCODINGS: Final[dict[str, Encoding]] = {
    "pcm16": "pcm16",
    "int16": "pcm16",  # WhisperLive's name
    "s16le": "pcm16",
    "float32": "float32",
    "f32le": "float32",
}
_MODES: Final[tuple[Mode, ...]] = ("push_to_talk", "server_vad")
# Keys that make a query string an implicit start (anything else, e.g. an auth token, does not).
START_KEYS: Final = frozenset(
    {
        "sample_rate",
        "encoding",
        "channels",
        "mode",
        "partials",
        "unstable",
        "segments",
        "language",
        "detect_language",
        "model",
        "beam_size",
        "task",
        "prompt",
        "turn_detection",
        "eagerness",
        "assistant",
        "speak",
        "voice",
        "system_prompt",
        "audio_sample_rate",
        "noise_suppression",
        "echo_cancellation",
        "wake",
    }
)
# Answer audio (binary frames to the client) is 16-bit PCM at one of these rates.
_ANSWER_RATES_HZ: Final = (8000, 16000, 22050, 24000, 44100, 48000)
NO_CLIENT_TOOLS: Final = ClientTools(())


@dataclass(frozen=True)
class StreamConfig:
    """The effective configuration of a stream after a ``start`` (echoed in ``ready``)."""

    options: StreamOptions
    sample_rate_hz: int = SAMPLE_RATE_HZ
    encoding: Encoding = "pcm16"
    channels: int = 1
    mode: Mode = "server_vad"
    partials: bool = False
    unstable: bool = False  # partials also carry the latest hypothesis' unpromised words
    segments: bool = False
    # The voice loop: answer each final (text messages, and speech as binary PCM frames).
    assistant: bool = False
    assistant_values: tuple[tuple[str, object], ...] = ()  # system_prompt / voice / speak as sent
    audio_sample_rate_hz: int = SAMPLE_RATE_HZ
    noise_level: int = 0  # WebRTC noise suppression before the VAD (audio/noise.py); 0 = off
    # Echo cancellation of the answers the server speaks (audio/echo.py): "auto" = with the assistant,
    # the canceller's output used where the microphone carries the echo (audio/echo_presence.py).
    # Where the start does not say: ``echo_cancellation_default`` ("auto"; docs/echo.md).
    echo_cancellation: EchoMode = "off"
    wake: tuple[str, ...] | None = None  # wake word models gating the stream (wake/gate.py); None = off
    # Functions the client runs itself (assistant/client_tools.py), with ``tool_choice``; assistant only.
    client_tools: ClientTools = NO_CLIENT_TOOLS
    # The client named the model (this start or an earlier one): it is kept whatever the language;
    # otherwise a language the English-only default cannot do takes translation_model (afresh at each start).
    model_named: bool = False

    @property
    def pcm_format(self) -> PcmFormat:
        is_float = self.encoding == "float32"
        return PcmFormat(self.sample_rate_hz, 32 if is_float else 16, self.channels, is_float=is_float)

    @property
    def echo_cancelling(self) -> bool:
        """Whether the microphone's echo of the answers is cancelled (``auto``: when the server speaks)."""
        return self.echo_cancellation == "on" or (self.echo_cancellation == "auto" and self.assistant)

    @property
    def server_vad(self) -> bool:
        return self.mode == "server_vad"

    def stream_options(self) -> StreamOptions:
        transcription = replace(self.options.transcription, with_segment_timestamps=self.segments)
        return replace(
            self.options,
            transcription=transcription,
            server_vad=self.server_vad,
            partials=self.partials,
            unstable_partials=self.partials and self.unstable,
        )

    def _assistant_described(self) -> dict[str, Any]:
        if not self.assistant:
            return {}
        described: dict[str, Any] = {"assistant": True, "audio_sample_rate": self.audio_sample_rate_hz}
        if self.client_tools.specs:
            described["tools"] = [spec.name for spec in self.client_tools.specs]
        return described

    def _turn_described(self) -> dict[str, Any]:
        """``turn_detection`` / ``eagerness`` when the session chose them (else the server's settings hold)."""
        chosen = {"turn_detection": self.options.turn_detection, "eagerness": self.options.eagerness}
        return {key: value for key, value in chosen.items() if value is not None}

    def describe(self) -> dict[str, Any]:
        t = self.options.transcription
        return (
            {
                "sample_rate": self.sample_rate_hz,
                "encoding": self.encoding,
                "channels": self.channels,
                "mode": self.mode,
                "partials": self.partials,
                "unstable": self.unstable,
                "segments": self.segments,
                "language": t.language,
                "model": self.options.model,
                "beam_size": t.beam_size,
                "task": t.task,
                "prompt": t.initial_prompt,
                "noise_suppression": self.noise_level,
                "echo_cancellation": self.echo_cancelling,
                "wake": list(self.wake) if self.wake is not None else None,
            }
            | self._turn_described()
            | self._assistant_described()
        )


def _text(value: object) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def parse_start(
    values: Mapping[str, object], settings: Settings, models: ModelRegistry, base: StreamConfig | None = None
) -> StreamConfig:
    """Validate a start message (or query string) into a config; omitted keys keep ``base``.

    Raises ``InvalidParameter`` (naming the key) or ``UnknownModel``; unknown keys are ignored.
    """
    text = {k: t for k, v in values.items() if (t := _text(v)) is not None}
    encoding = base.encoding if base else "pcm16"
    raw_encoding = values.get("encoding")
    if raw_encoding is not None:
        found = _ENCODINGS.get(raw_encoding.strip().lower()) if isinstance(raw_encoding, str) else None
        if found is None:
            raise InvalidParameter(
                f"encoding must be 'pcm16' or 'float32' (little-endian PCM), got {raw_encoding!r}", param="encoding"
            )
        encoding = found
    sample_rate = parse_int(
        text,
        "sample_rate",
        base.sample_rate_hz if base else SAMPLE_RATE_HZ,
        minimum=MIN_SAMPLE_RATE_HZ,
        maximum=MAX_SAMPLE_RATE_HZ,
    )
    channels = parse_int(text, "channels", base.channels if base else 1, minimum=1, maximum=MAX_CHANNELS)
    mode: Mode = base.mode if base else "server_vad"
    raw_mode = values.get("mode")
    if raw_mode is not None:
        if raw_mode not in _MODES:
            raise InvalidParameter(f"mode must be 'push_to_talk' or 'server_vad', got {raw_mode!r}", param="mode")
        mode = "push_to_talk" if raw_mode == "push_to_talk" else "server_vad"
    partials = parse_bool(text, "partials", base.partials if base else False)
    unstable = parse_bool(text, "unstable", base.unstable if base else False)
    segments = parse_bool(text, "segments", base.segments if base else False)

    option_values: dict[str, object] = dict(values)
    if "language" in values and (values["language"] is None or str(values["language"]).strip() == ""):
        # JSON null (or an empty query value) asks for detection; stream_options_from would keep the base.
        del option_values["language"]
        option_values["detect_language"] = True
    options = stream_options_from(option_values, settings, base=base.options if base else None)
    model_named = bool(text.get("model", "").strip()) or (base.model_named if base else False)
    requested = options.model if model_named else None
    model = models.resolve(models.for_options(requested, options.transcription))
    models.check_options(model, options.transcription)
    assistant = parse_bool(text, "assistant", base.assistant if base else False)
    audio_rate = parse_int(
        text, "audio_sample_rate", base.audio_sample_rate_hz if base else SAMPLE_RATE_HZ, minimum=8000, maximum=48000
    )
    if audio_rate not in _ANSWER_RATES_HZ:
        raise InvalidParameter(
            f"audio_sample_rate must be one of {', '.join(map(str, _ANSWER_RATES_HZ))}, got {audio_rate}",
            param="audio_sample_rate",
        )
    assistant_values = dict(base.assistant_values) if base else {}
    for key, kind in (("system_prompt", str), ("voice", str), ("speak", bool)):
        if key in values and values[key] is not None:
            value = values[key]
            if key == "speak" and isinstance(value, str):
                value = parse_bool(text, "speak")
            if not isinstance(value, kind):
                raise InvalidParameter(f"{key} must be a {'string' if kind is str else 'boolean'}", param=key)
            assistant_values[key] = value
    if "noise_suppression" in values:
        noise_level = parse_level(values["noise_suppression"], settings)
    else:
        noise_level = base.noise_level if base else parse_level(None, settings)
    echo = parse_echo_option(values["echo_cancellation"]) if "echo_cancellation" in values else None
    echo = echo or (base.echo_cancellation if base else settings.echo_cancellation_default)
    wake_names = parse_wake_option(values["wake"], settings) if "wake" in values else (base.wake if base else None)
    client_tools = _client_tools(values, assistant, base)
    if wake_names is not None and mode != "server_vad":
        raise InvalidParameter(
            "wake needs mode 'server_vad' (the VAD finds the command after the wake word)", param="wake"
        )
    return StreamConfig(
        options=replace(options, model=model),
        sample_rate_hz=sample_rate,
        encoding=encoding,
        channels=channels,
        mode=mode,
        partials=partials,
        unstable=unstable,
        segments=segments,
        assistant=assistant,
        assistant_values=tuple(assistant_values.items()),
        audio_sample_rate_hz=audio_rate,
        noise_level=noise_level,
        echo_cancellation=echo,
        wake=tuple(wake_names) if wake_names is not None else None,
        client_tools=client_tools,
        model_named=model_named,
    )


def _client_tools(values: Mapping[str, object], assistant: bool, base: StreamConfig | None) -> ClientTools:
    """``tools`` and ``tool_choice``, each kept from the earlier start when not given (``tools``
    alone leaves the choice to the server's setting). Only with the assistant, which calls them."""
    kept = base.client_tools if base else NO_CLIENT_TOOLS
    if "tools" in values:
        declared = parse_client_tools(values["tools"], values.get("tool_choice"))
    elif "tool_choice" in values:  # a new choice among the tools declared before
        declared = parse_client_tools([spec.openai() for spec in kept.specs], values["tool_choice"])
    else:
        declared = kept
    if assistant:
        return declared
    if declared.specs and "tools" in values:
        raise InvalidParameter("'tools' needs 'assistant': true", param="tools")
    return NO_CLIENT_TOOLS
