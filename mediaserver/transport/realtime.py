"""OpenAI Realtime API transcription sessions over WebSocket at ``GET /v1/realtime``.

The wire contract is OpenAI's (shared/reference/protocols.md, "Realtime API"), so the official SDKs
connect with only the base URL changed: ``AsyncOpenAI(base_url=".../v1").realtime.connect(...)``
opens ``ws://.../v1/realtime?model=...`` (or ``?intent=transcription``) with ``Authorization:
Bearer``, which the app's auth middleware checks like any other request. Only transcription
sessions exist here: any ``?model=`` the registry does not know but that names an OpenAI model
(``gpt-...``, ``whisper-...``) means the server's default model.

Client events: ``session.update`` (GA nested shape ``session.audio.input.{format, transcription,
turn_detection}``) and ``transcription_session.update`` (beta flat shape ``input_audio_format``,
``input_audio_transcription``, ``turn_detection``; both shapes are accepted in both events),
``input_audio_buffer.append`` / ``commit`` / ``clear``. Server events: ``session.created`` on
connect (plus ``transcription_session.created`` for beta clients, who send ``OpenAI-Beta:
realtime=v1``), ``session.updated`` or ``transcription_session.updated``, ``input_audio_buffer.
speech_started`` / ``speech_stopped`` / ``committed`` / ``cleared``, ``conversation.item.added`` +
``conversation.item.done`` (beta: ``conversation.item.created``), ``conversation.item.
input_audio_transcription.delta`` / ``completed`` / ``failed``, and ``error``.

Deltas are append-only: every delta of an item is new text after the previous ones, and their
concatenation is exactly the item's ``completed.transcript`` (the ``StreamSession`` forces each decode
to start with the text already sent; the final's remainder is the last delta). With server VAD the
deltas are sent live while the user speaks, so they can precede ``speech_stopped`` and ``committed``;
their ``item_id`` is the one announced in ``speech_started``. In manual mode (``turn_detection:
null``) the transcript of a committed buffer arrives as one delta, then ``completed``.

Audio: ``audio/pcm`` is 16-bit little-endian mono at 24 kHz; ``rate: 16000`` is an extension of this
server (beta clients may send the GA format object as ``input_audio_format``). ``audio/pcmu`` /
``audio/pcma`` (beta ``g711_ulaw`` / ``g711_alaw``) are G.711 at 8 kHz. Everything is resampled to
16 kHz by a resampler that keeps its state across appends. One append carries at most 15 MiB of audio.

Turn detection maps onto the VAD segmenter: ``silence_duration_ms`` → hangover, ``prefix_padding_ms``
→ pre-roll, ``threshold`` 0..1 → webrtcvad aggressiveness 0..3 (``int(threshold * 4)``, capped at 3);
fields left out keep the server's ``stream_vad_*`` settings. ``semantic_vad`` runs the same server VAD,
its ``eagerness`` choosing the silence that ends a turn (low 1000 ms, high 300 ms, else the setting).
As with OpenAI, every detected start of speech becomes an item with a transcript (possibly empty):
the segmenter's minimum speech length is off here. Changing turn detection finishes the utterance in
progress first. ``noise_reduction``, ``include``, ``keywords`` and ``delay`` are accepted and ignored.

Errors are ``error`` events, ``{type: "error", event_id, error: {type, code, message, param,
event_id}}`` where ``error.event_id`` is the client event that caused it; the session stays open.
Codes are OpenAI's where known (``invalid_value``, ``invalid_type``, ``missing_required_parameter``,
``input_audio_buffer_commit_empty``, ``model_not_found``), else descriptive (``invalid_json``,
``audio_too_large``, ``unsupported_event``).

Each connection has a reader (the request handler: parses, validates, decodes), a worker that applies
the reader's queue in order to the ``StreamSession`` (so a manual commit waiting for its transcript
never stops the socket from being read), and a writer that sends queued events in order. Closing
always ends in ``RealtimeSession.aclose``: the session leaves ``app[SESSIONS]`` and every task it
started (all carry the session id in their names) is cancelled.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import numpy as np
import numpy.typing as npt
from aiohttp import WSCloseCode, WSMsgType, web

from mediaserver.asr.models import ModelRegistry
from mediaserver.asr.scheduler import DeadlineExceeded
from mediaserver.audio.decode import PcmFormat, StreamResampler, pcm_to_float
from mediaserver.audio.segmenter import SegmenterConfig
from mediaserver.config import Settings
from mediaserver.errors import ApiError, InvalidParameter, UnknownModel
from mediaserver.events import (
    SAMPLE_RATE_HZ,
    AudioArray,
    FinalTranscript,
    PartialTranscript,
    SessionEvent,
    SpeechStarted,
    SpeechStopped,
    StreamError,
    TranscriptionOptions,
)
from mediaserver.languages import normalize_language
from mediaserver.session import Emit, StreamOptions, StreamSession, segmenter_config
from mediaserver.state import ASR, SESSIONS, SETTINGS

log = logging.getLogger(__name__)

PATH: Final = "/v1/realtime"

MAX_AUDIO_BYTES_PER_EVENT: Final = 15 * 1024 * 1024
# base64 of the largest append plus room for the JSON around it; larger frames close the socket (1009).
MAX_FRAME_BYTES: Final = (MAX_AUDIO_BYTES_PER_EVENT + 2) // 3 * 4 + 1024 * 1024
MIN_COMMIT_MS: Final = 100  # OpenAI's minimum for input_audio_buffer.commit
MAX_BUFFER_S: Final = 10 * 60  # audio in one append, and uncommitted audio in manual mode
MAX_BACKLOG_S: Final = 15 * 60  # audio decoded by the reader but not yet fed by the worker
MAX_QUEUED_WORK: Final = 8192
MAX_QUEUED_EVENTS: Final = 10000  # server events a client has not read yet; beyond: closed
MAX_RETIRED_STREAMS: Final = 4
MAX_VAD_MS: Final = 10000
CLOSE_IDLE_TIMEOUT: Final = 4408
FLUSH_ON_CLOSE_S: Final = 1.0

AudioType = Literal["audio/pcm", "audio/pcmu", "audio/pcma"]
TurnType = Literal["server_vad", "semantic_vad"]
_AUDIO_TYPES: Final[tuple[AudioType, ...]] = ("audio/pcm", "audio/pcmu", "audio/pcma")
_BETA_FORMATS: Final[dict[str, AudioType]] = {
    "pcm16": "audio/pcm",
    "g711_ulaw": "audio/pcmu",
    "g711_alaw": "audio/pcma",
}
_PCM_RATES_HZ: Final = (24000, 16000)
_G711_RATE_HZ: Final = 8000
_EAGERNESS: Final = ("low", "medium", "high", "auto")
_EAGERNESS_SILENCE_MS: Final = {"low": 1000, "high": 300}
# Client events of the full Realtime API that a transcription session has no use for.
_UNSUPPORTED_EVENTS: Final = frozenset(
    {
        "conversation.item.create",
        "conversation.item.retrieve",
        "conversation.item.truncate",
        "conversation.item.delete",
        "response.create",
        "response.cancel",
        "output_audio_buffer.clear",
    }
)
_SUPPORTED_EVENTS: Final = (
    "session.update",
    "transcription_session.update",
    "input_audio_buffer.append",
    "input_audio_buffer.commit",
    "input_audio_buffer.clear",
)
# StreamError codes that are the client's fault rather than the server's.
_CLIENT_ERROR_CODES: Final = frozenset({"invalid_parameter", "model_not_found", "invalid_audio", "audio_too_large"})


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:22]}"


# --- G.711 --------------------------------------------------------------------------------------------


def _ulaw_table() -> npt.NDArray[np.int16]:
    codes = ~np.arange(256, dtype=np.int32) & 0xFF
    exponent = (codes >> 4) & 0x07
    magnitude = (((codes & 0x0F) << 3) + 0x84 << exponent) - 0x84
    return np.where(codes & 0x80, -magnitude, magnitude).astype(np.int16)


def _alaw_table() -> npt.NDArray[np.int16]:
    codes = np.arange(256, dtype=np.int32) ^ 0x55
    exponent = (codes >> 4) & 0x07
    mantissa = codes & 0x0F
    magnitude = np.where(exponent == 0, (mantissa << 4) + 8, ((mantissa << 4) + 0x108) << np.maximum(exponent - 1, 0))
    return np.where(codes & 0x80, magnitude, -magnitude).astype(np.int16)


ULAW_TO_PCM16: Final = _ulaw_table()
ALAW_TO_PCM16: Final = _alaw_table()


# --- configuration ------------------------------------------------------------------------------------


class EventError(Exception):
    """A client event that cannot be applied; becomes an ``error`` event, the session stays open."""

    def __init__(self, code: str, message: str, param: str | None = None, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param
        self.kind = kind


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

    def beta(self) -> str | dict[str, Any]:
        if self.is_pcm and self.rate_hz != 24000:
            return self.ga()
        return next(name for name, kind in _BETA_FORMATS.items() if kind == self.type)


@dataclass(frozen=True)
class TurnDetection:
    """Server VAD settings; ``None`` fields keep the server's ``stream_vad_*`` settings."""

    type: TurnType = "server_vad"
    threshold: float | None = None
    prefix_padding_ms: int | None = None
    silence_duration_ms: int | None = None
    eagerness: str | None = None

    def segmenter(self, settings: Settings) -> SegmenterConfig:
        # Every detected start of speech becomes an item, as with OpenAI: no minimum speech length.
        overrides: dict[str, int | float] = {"min_speech_ms": 0}
        silence_ms = self.silence_duration_ms
        if silence_ms is None and self.type == "semantic_vad":
            silence_ms = _EAGERNESS_SILENCE_MS.get(self.eagerness or "auto")
        if silence_ms is not None:
            overrides["hangover_ms"] = max(60, silence_ms)
        if self.prefix_padding_ms is not None:
            overrides["preroll_ms"] = self.prefix_padding_ms
        if self.threshold is not None:
            overrides["aggressiveness"] = min(3, int(self.threshold * 4))
        return segmenter_config(settings, **overrides)

    def describe(self, settings: Settings) -> dict[str, Any]:
        described: dict[str, Any] = {"type": self.type}
        if self.type == "semantic_vad":
            described["eagerness"] = self.eagerness or "auto"
        described.update(
            threshold=0.5 if self.threshold is None else self.threshold,
            prefix_padding_ms=(
                settings.stream_vad_preroll_ms if self.prefix_padding_ms is None else self.prefix_padding_ms
            ),
            silence_duration_ms=(
                settings.stream_vad_hangover_ms if self.silence_duration_ms is None else self.silence_duration_ms
            ),
        )
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

    @property
    def server_vad(self) -> bool:
        return self.turn_detection is not None

    def stream_options(self, settings: Settings) -> StreamOptions:
        transcription = TranscriptionOptions(
            language=self.language,
            beam_size=settings.default_beam_size,
            initial_prompt=self.prompt or None,
            with_segment_timestamps=False,
        )
        # Partials are what delta events carry; a manual commit is transcribed in one go.
        return StreamOptions(self.resolved_model, transcription, server_vad=self.server_vad, partials=self.server_vad)

    def segmenter(self, settings: Settings) -> SegmenterConfig:
        return (self.turn_detection or TurnDetection()).segmenter(settings)

    def _transcription(self) -> dict[str, Any]:
        return {"model": self.model, "language": self.language, "prompt": self.prompt or ""}

    def describe_ga(self, session_id: str, settings: Settings) -> dict[str, Any]:
        turn = self.turn_detection.describe(settings) if self.turn_detection is not None else None
        return {
            "type": "transcription",
            "id": session_id,
            "object": "realtime.transcription_session",
            "expires_at": 0,
            "audio": {
                "input": {
                    "format": self.input_format.ga(),
                    "noise_reduction": None,
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
            "input_audio_noise_reduction": None,
            "include": list(self.include) if self.include is not None else None,
        }


def _type_name(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object" if isinstance(value, dict) else type(value).__name__


def _object(value: object, param: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise EventError(
            "invalid_type", f"Invalid type for '{param}': expected an object, but got {_type_name(value)}.", param
        )
    return value


def _optional_str(value: object, param: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise EventError(
        "invalid_type", f"Invalid type for '{param}': expected a string, but got {_type_name(value)}.", param
    )


def _number(value: object, param: str, minimum: float, maximum: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise EventError(
            "invalid_type", f"Invalid type for '{param}': expected a number, but got {_type_name(value)}.", param
        )
    if not minimum <= value <= maximum:
        raise EventError(
            "invalid_value", f"Invalid '{param}': {value}. Expected a value from {minimum} to {maximum}.", param
        )
    return float(value)


def _integer(value: object, param: str, minimum: int, maximum: int) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise EventError(
            "invalid_type", f"Invalid type for '{param}': expected an integer, but got {_type_name(value)}.", param
        )
    if value < minimum:
        raise EventError("integer_below_min_value", f"Invalid '{param}': {value}. Minimum is {minimum}.", param)
    if value > maximum:
        raise EventError("integer_above_max_value", f"Invalid '{param}': {value}. Maximum is {maximum}.", param)
    return value


def parse_format(value: object, param: str) -> InputFormat:
    if isinstance(value, str):  # beta: "pcm16" | "g711_ulaw" | "g711_alaw"
        kind = _BETA_FORMATS.get(value)
        if kind is None:
            raise EventError(
                "invalid_value",
                f"Invalid '{param}': {value!r}. Supported values are: 'pcm16', 'g711_ulaw' and 'g711_alaw'.",
                param,
            )
        return InputFormat(kind, 24000 if kind == "audio/pcm" else _G711_RATE_HZ)
    spec = _object(value, param)
    raw_type = spec.get("type", "audio/pcm")
    kind = next((t for t in _AUDIO_TYPES if t == raw_type), None)
    if kind is None:
        raise EventError(
            "invalid_value",
            f"Invalid '{param}.type': {raw_type!r}. Supported values are: 'audio/pcm', 'audio/pcmu' and 'audio/pcma'.",
            f"{param}.type",
        )
    raw_rate = spec.get("rate")
    if kind == "audio/pcm":
        rate = 24000 if raw_rate is None else _integer(raw_rate, f"{param}.rate", 1, 1_000_000)
        if rate not in _PCM_RATES_HZ:
            raise EventError(
                "invalid_value",
                f"Invalid '{param}.rate': {rate}. Supported values are: 24000 (and 16000, an extension of this "
                "server).",
                f"{param}.rate",
            )
        return InputFormat(kind, rate)
    if raw_rate is not None and _integer(raw_rate, f"{param}.rate", 1, 1_000_000) != _G711_RATE_HZ:
        raise EventError(
            "invalid_value", f"Invalid '{param}.rate': {raw_rate}. G.711 audio is 8000 Hz.", f"{param}.rate"
        )
    return InputFormat(kind, _G711_RATE_HZ)


def parse_turn_detection(value: object, param: str) -> TurnDetection | None:
    if value is None:
        return None
    spec = _object(value, param)
    raw_type = spec.get("type", "server_vad")
    if raw_type not in ("server_vad", "semantic_vad"):
        raise EventError(
            "invalid_value",
            f"Invalid '{param}.type': {raw_type!r}. Supported values are: 'server_vad' and 'semantic_vad'.",
            f"{param}.type",
        )
    kind: TurnType = "semantic_vad" if raw_type == "semantic_vad" else "server_vad"
    threshold = spec.get("threshold")
    prefix_ms = spec.get("prefix_padding_ms")
    silence_ms = spec.get("silence_duration_ms")
    eagerness = spec.get("eagerness")
    if eagerness is not None and eagerness not in _EAGERNESS:
        raise EventError(
            "invalid_value",
            f"Invalid '{param}.eagerness': {eagerness!r}. Supported values are: 'low', 'medium', 'high' and 'auto'.",
            f"{param}.eagerness",
        )
    return TurnDetection(
        kind,
        threshold=None if threshold is None else _number(threshold, f"{param}.threshold", 0.0, 1.0),
        prefix_padding_ms=None
        if prefix_ms is None
        else _integer(prefix_ms, f"{param}.prefix_padding_ms", 0, MAX_VAD_MS),
        silence_duration_ms=(
            None if silence_ms is None else _integer(silence_ms, f"{param}.silence_duration_ms", 0, MAX_VAD_MS)
        ),
        eagerness=eagerness if kind == "semantic_vad" else None,
    )


def _language(value: object, param: str) -> str | None:
    text = _optional_str(value, param)
    try:
        return normalize_language(text)
    except ValueError:
        raise EventError(
            "invalid_value", f"Invalid '{param}': {text!r} is not a supported language (ISO-639-1, e.g. 'en').", param
        ) from None


def resolve_model(models: ModelRegistry, requested: str | None, param: str) -> str:
    """The registry name for a model; OpenAI's model names (``gpt-...``, ``whisper-...``) mean the default."""
    try:
        return models.resolve(requested)
    except UnknownModel as exc:
        if requested is not None and requested.strip().lower().startswith(("gpt-", "whisper-")):
            return models.resolve(None)
        raise EventError("model_not_found", exc.message, param) from None


def parse_session(session: Mapping[str, Any], base: RealtimeConfig, models: ModelRegistry) -> RealtimeConfig:
    """Apply a ``session`` object (GA nested or beta flat shape) to ``base``; all or nothing."""
    session_type = session.get("type")
    if session_type is not None and session_type != "transcription":
        raise EventError(
            "invalid_value",
            f"Invalid 'session.type': {session_type!r}. This server only runs transcription sessions "
            "(session.type = 'transcription').",
            "session.type",
        )
    fmt = base.input_format
    turn = base.turn_detection
    model, language, prompt = base.model, base.language, base.prompt
    model_param = "session.audio.input.transcription.model"

    def transcription(value: object, param: str) -> None:
        nonlocal model, language, prompt, model_param
        if value is None:
            return  # OpenAI turns transcription off; a transcription session keeps its settings
        spec = _object(value, param)
        if "model" in spec:
            requested = _optional_str(spec["model"], f"{param}.model")
            model = requested.strip() if requested and requested.strip() else models.resolve(None)
            model_param = f"{param}.model"
        if "language" in spec:
            language = _language(spec["language"], f"{param}.language")
        elif isinstance(spec.get("languages"), list):
            candidates = [_language(v, f"{param}.languages") for v in spec["languages"]]
            language = candidates[0] if len(candidates) == 1 else None
        if "prompt" in spec:
            prompt = _optional_str(spec["prompt"], f"{param}.prompt")

    # Beta flat shape.
    if "input_audio_format" in session:
        fmt = parse_format(session["input_audio_format"], "session.input_audio_format")
    if "input_audio_transcription" in session:
        transcription(session["input_audio_transcription"], "session.input_audio_transcription")
    if "turn_detection" in session:
        turn = parse_turn_detection(session["turn_detection"], "session.turn_detection")
    # GA nested shape.
    if "audio" in session:
        audio = _object(session["audio"], "session.audio")
        if "input" in audio:
            audio_input = _object(audio["input"], "session.audio.input")
            if "format" in audio_input:
                fmt = parse_format(audio_input["format"], "session.audio.input.format")
            if "transcription" in audio_input:
                transcription(audio_input["transcription"], "session.audio.input.transcription")
            if "turn_detection" in audio_input:
                turn = parse_turn_detection(audio_input["turn_detection"], "session.audio.input.turn_detection")
    include = base.include
    if "include" in session:
        raw_include = session["include"]
        if raw_include is not None and (
            not isinstance(raw_include, list) or not all(isinstance(v, str) for v in raw_include)
        ):
            raise EventError(
                "invalid_type", "Invalid type for 'session.include': expected an array of strings.", "session.include"
            )
        include = tuple(raw_include) if raw_include is not None else None

    resolved = resolve_model(models, model, model_param)
    if models.source(resolved).multilingual is False and language not in (None, "en"):
        param = model_param.rsplit(".", 1)[0] + ".language"
        raise EventError(
            "invalid_value",
            f"Invalid '{param}': model {resolved!r} is English-only; language {language!r} needs a multilingual model.",
            param,
        )
    return RealtimeConfig(model, resolved, fmt, language, prompt, turn, include)


def default_config(settings: Settings, models: ModelRegistry, query: Mapping[str, str]) -> RealtimeConfig:
    """The configuration of a new session: server defaults, and a ``?model=`` the registry knows.

    OpenAI's realtime (conversation) model names in the URL (``gpt-realtime`` ...) mean the default
    transcription model; other unknown names are a 400 before the upgrade.
    """
    intent = query.get("intent", "").strip()
    if intent not in ("", "transcription"):
        raise InvalidParameter(f"intent must be 'transcription' (got {intent!r})", param="intent")
    requested = query.get("model", "").strip()
    model = settings.default_model
    if requested:
        try:
            models.resolve(requested)
            model = requested
        except UnknownModel:
            try:
                resolve_model(models, requested, "model")
            except EventError as exc:
                raise InvalidParameter(exc.message, param="model") from None
    return RealtimeConfig(model, resolve_model(models, model, "model"), language=settings.default_language or None)


# --- audio --------------------------------------------------------------------------------------------


class InputDecoder:
    """Appended audio → 16 kHz mono float32, with one resampler whose state spans appends.

    (Resampling each append on its own would put a click at every boundary.) A PCM16 append of an
    odd number of bytes keeps its last byte for the next append.
    """

    def __init__(self, fmt: InputFormat) -> None:
        self.format = fmt
        self._carry = b""
        self._resampler = StreamResampler(fmt.rate_hz)

    def decode(self, data: bytes) -> AudioArray:
        if self.format.is_pcm:
            data = self._carry + data
            usable = len(data) - len(data) % 2
            self._carry = data[usable:]
            if usable == 0:
                return np.zeros(0, np.float32)
            # Told the rate is 16 kHz, pcm_to_float only converts; the stateful resampler does the rest.
            mono = pcm_to_float(data[:usable], PcmFormat(SAMPLE_RATE_HZ, 16, 1))
        else:
            table = ULAW_TO_PCM16 if self.format.type == "audio/pcmu" else ALAW_TO_PCM16
            mono = table[np.frombuffer(data, dtype=np.uint8)].astype(np.float32) / 32768.0
        return self._resampler.push(mono)

    def flush(self) -> AudioArray:
        """The resampler's delayed tail (before a commit); the next append starts afresh."""
        self._carry = b""
        return self._resampler.flush()

    def reset(self) -> None:
        self._resampler.reset()
        self._carry = b""


# --- the session ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Audio:
    samples: AudioArray


@dataclass(frozen=True)
class _Configure:
    config: RealtimeConfig
    reply: str  # "session.updated" or "transcription_session.updated"


@dataclass(frozen=True)
class _Commit:
    client_event_id: str | None


@dataclass(frozen=True)
class _Clear:
    pass


_Work = _Audio | _Configure | _Commit | _Clear


@dataclass
class _Item:
    """A user audio item: its id and the transcript text its delta events have carried so far."""

    id: str
    sent: str = ""


class RealtimeSession:
    """One WebSocket connection: reader (the handler), worker, writer and the StreamSession."""

    def __init__(
        self,
        app: web.Application,
        ws: web.WebSocketResponse,
        settings: Settings,
        config: RealtimeConfig,
        *,
        beta: bool,
    ) -> None:
        self.id = _new_id("sess")
        self.ws = ws
        self.settings = settings
        self.asr = app[ASR]
        self.models = self.asr.registry
        self.registry = app[SESSIONS]
        self.beta = beta  # send beta event names (conversation.item.created)
        self.last_activity = time.monotonic()
        self.opened_at = time.monotonic()
        # The reader's view: what the latest valid session.update said.
        self.config = config
        self._decoder = InputDecoder(config.input_format)
        self._buffered_ms = 0.0  # manual mode: uncommitted audio
        self._backlog_samples = 0
        # The worker's view.
        self._applied = config
        self._segmenter = config.segmenter(settings)
        self._fed_samples = 0
        self.stream = self._new_stream(config)
        self._retired: list[StreamSession] = []
        self._speaking: _Item | None = None  # server VAD: the item being spoken
        self._awaiting: dict[int, _Item] = {}  # server VAD: audio_start_ms → item awaiting its transcript
        self._last_item_id: str | None = None
        self._muted_errors = 0  # >0 while a commit reports its own failure
        self.items_completed = 0
        self._work: asyncio.Queue[_Work] = asyncio.Queue(MAX_QUEUED_WORK)
        self._outbox: asyncio.Queue[str] = asyncio.Queue()
        self._worker: asyncio.Task[None] | None = None
        self._writer: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._overflowed = False
        self._closed = False

    # --- lifecycle ----------------------------------------------------------------------------------

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._writer = loop.create_task(self._write(), name=f"realtime-writer-{self.id}")
        self._worker = loop.create_task(self._run_worker(), name=f"realtime-worker-{self.id}")

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=f"{name}-{self.id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _new_stream(self, config: RealtimeConfig) -> StreamSession:
        """A StreamSession for one turn-detection setting (its segmenter and mode are fixed for its life)."""
        offset_ms = self._fed_samples * 1000 // SAMPLE_RATE_HZ
        emit = self._emitter(offset_ms, server_vad=config.server_vad)
        stream = StreamSession(
            self.asr, self.settings, emit, session_id=self.id, segmenter=config.segmenter(self.settings)
        )
        stream.configure(config.stream_options(self.settings))
        if not config.server_vad:
            stream.start_recording()
        return stream

    async def aclose(self, code: int = WSCloseCode.GOING_AWAY, reason: str = "session closed") -> None:
        """Idempotent; every task is cancelled before the first await, so nothing outlives the session."""
        if self._closed:
            return
        self._closed = True
        self.registry.discard(self.id)
        current = asyncio.current_task()
        others = [t for t in (self._worker, *self._tasks) if t is not None and t is not current]
        for task in others:
            task.cancel()
        try:
            for stream in (self.stream, *self._retired):
                await stream.aclose()
            for task in others:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            if self.ws.prepared and not self.ws.closed and self._writer is not None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._outbox.join(), FLUSH_ON_CLOSE_S)
        finally:
            if self._writer is not None and self._writer is not current:
                self._writer.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await self._writer
            if self.ws.prepared and not self.ws.closed:
                await self.ws.close(code=code, message=reason.encode("utf-8")[:123])
            log.info(
                "realtime session %s: closed after %.1f s (code %s), %d items, %.1f s audio",
                self.id,
                time.monotonic() - self.opened_at,
                self.ws.close_code,
                self.items_completed,
                self._fed_samples / SAMPLE_RATE_HZ,
            )

    # --- sending ------------------------------------------------------------------------------------

    def send(self, kind: str, **fields: Any) -> None:
        """Queue a server event (never awaits, so a cancelled caller cannot lose half of an item)."""
        if self._closed:
            return
        if self._outbox.qsize() >= MAX_QUEUED_EVENTS:
            if not self._overflowed:
                self._overflowed = True
                log.warning("realtime session %s: client does not read its events; closing", self.id)
                self._spawn(self.aclose(WSCloseCode.POLICY_VIOLATION, "client too slow"), "realtime-close")
            return
        self._outbox.put_nowait(json.dumps({"type": kind, "event_id": _new_id("event"), **fields}))

    def send_error(
        self,
        code: str,
        message: str,
        *,
        param: str | None = None,
        client_event_id: str | None = None,
        kind: str = "invalid_request_error",
    ) -> None:
        self.send(
            "error",
            error={"type": kind, "code": code, "message": message, "param": param, "event_id": client_event_id},
        )

    async def _write(self) -> None:
        while True:
            text = await self._outbox.get()
            try:
                if not self.ws.closed:
                    await self.ws.send_str(text)
            except (ConnectionError, RuntimeError):
                log.debug("realtime session %s: connection gone while sending", self.id)
            finally:
                self._outbox.task_done()

    def send_session(self, kind: str, config: RealtimeConfig) -> None:
        if kind.startswith("transcription_session."):
            self.send(kind, session=config.describe_beta(self.id, self.settings))
        else:
            self.send(kind, session=config.describe_ga(self.id, self.settings))

    # --- StreamSession events → server events ----------------------------------------------------

    def _emitter(self, offset_ms: int, *, server_vad: bool) -> Emit:
        async def emit(event: SessionEvent) -> None:
            self._on_event(event, offset_ms, server_vad=server_vad)

        return emit

    def _on_event(self, event: SessionEvent, offset_ms: int, *, server_vad: bool) -> None:
        """Translate one StreamSession event; ``offset_ms`` places the stream's clock on the session's."""
        if isinstance(event, SpeechStarted):
            item = _Item(_new_id("item"))
            self._speaking = item
            self._awaiting[event.audio_start_ms + offset_ms] = item
            self.send(
                "input_audio_buffer.speech_started", audio_start_ms=event.audio_start_ms + offset_ms, item_id=item.id
            )
        elif isinstance(event, PartialTranscript):
            speaking = self._speaking
            if speaking is not None and event.delta:
                speaking.sent += event.delta
                self.send(
                    "conversation.item.input_audio_transcription.delta",
                    item_id=speaking.id,
                    content_index=0,
                    delta=event.delta,
                )
        elif isinstance(event, SpeechStopped):
            stopped, self._speaking = self._speaking, None
            if stopped is None:
                return
            self.send(
                "input_audio_buffer.speech_stopped", audio_end_ms=event.audio_end_ms + offset_ms, item_id=stopped.id
            )
            self._committed(stopped)
        elif isinstance(event, FinalTranscript):
            if not server_vad:
                return  # a manual commit's final: the worker completes its item
            awaiting = self._awaiting.pop(event.audio_start_ms + offset_ms, None)
            if awaiting is not None:
                self._completed(awaiting, event)
        elif isinstance(event, StreamError) and not self._muted_errors:
            kind = "invalid_request_error" if event.code in _CLIENT_ERROR_CODES else "server_error"
            self.send_error(event.code, event.message, kind=kind)

    def _committed(self, item: _Item) -> None:
        self.send("input_audio_buffer.committed", previous_item_id=self._last_item_id, item_id=item.id)
        user_item = {
            "id": item.id,
            "object": "realtime.item",
            "type": "message",
            "status": "completed",
            "role": "user",
            "content": [{"type": "input_audio", "transcript": None}],
        }
        if self.beta:
            self.send("conversation.item.created", previous_item_id=self._last_item_id, item=user_item)
        else:
            self.send("conversation.item.added", previous_item_id=self._last_item_id, item=user_item)
            self.send("conversation.item.done", previous_item_id=self._last_item_id, item=user_item)
        self._last_item_id = item.id

    def _completed(self, item: _Item, final: FinalTranscript) -> None:
        transcript = item.sent + final.delta
        if transcript != final.transcript.text:  # cannot happen while StreamSession keeps its promise
            log.warning("realtime session %s: final does not extend its deltas; sending the deltas' text", self.id)
        if final.delta:
            self.send(
                "conversation.item.input_audio_transcription.delta",
                item_id=item.id,
                content_index=0,
                delta=final.delta,
            )
        seconds = max(0, final.audio_end_ms - final.audio_start_ms) / 1000.0
        self.send(
            "conversation.item.input_audio_transcription.completed",
            item_id=item.id,
            content_index=0,
            transcript=transcript,
            usage={"type": "duration", "seconds": round(seconds, 3)},
        )
        self.items_completed += 1

    def _failed(self, item: _Item, code: str, message: str, kind: str = "server_error") -> None:
        self.send(
            "conversation.item.input_audio_transcription.failed",
            item_id=item.id,
            content_index=0,
            error={"type": kind, "code": code, "message": message, "param": None},
        )

    # --- reading ------------------------------------------------------------------------------------

    async def run(self) -> None:
        """Read until the socket closes (or the idle timer closes it)."""
        idle_s = self.settings.ws_idle_timeout_s
        while not self.ws.closed:
            try:
                # Our own deadline: aiohttp's receive(timeout=) restarts on every heartbeat pong.
                async with asyncio.timeout_at(asyncio.get_running_loop().time() + self._idle_left(idle_s)):
                    msg = await self.ws.receive()
            except TimeoutError:
                if self._idle_left(idle_s) > 0:
                    continue
                log.info("realtime session %s: idle for %.0f s, closing", self.id, idle_s)
                self.send_error("idle_timeout", f"No client event for {idle_s:g} s; closing the session.")
                await self.aclose(CLOSE_IDLE_TIMEOUT, "idle timeout")
                return
            if msg.type == WSMsgType.TEXT:
                self.last_activity = time.monotonic()
                self._on_text(msg.data)
            elif msg.type == WSMsgType.BINARY:
                self.last_activity = time.monotonic()
                self.send_error("invalid_type", "Binary messages are not supported; send JSON events as text.")
            elif msg.type == WSMsgType.ERROR:
                log.info("realtime session %s: closed on error (code %s): %s", self.id, self.ws.close_code, msg.data)
                return
            else:  # CLOSE, CLOSING, CLOSED
                return

    def _idle_left(self, idle_s: float) -> float:
        return self.last_activity + idle_s - time.monotonic()

    def _on_text(self, data: str) -> None:
        try:
            event = json.loads(data)
        except (ValueError, RecursionError):
            self.send_error("invalid_json", "The client event is not valid JSON; expected a JSON object.")
            return
        if not isinstance(event, dict):
            self.send_error("invalid_json", "The client event must be a JSON object with a string 'type'.")
            return
        raw_id = event.get("event_id")
        client_event_id = raw_id if isinstance(raw_id, str) else None
        try:
            self._dispatch(event)
        except EventError as exc:
            self.send_error(exc.code, exc.message, param=exc.param, client_event_id=client_event_id, kind=exc.kind)

    def _dispatch(self, event: Mapping[str, Any]) -> None:
        kind = event.get("type")
        if kind is None:
            raise EventError("missing_required_parameter", "Missing required parameter: 'type'.", "type")
        if not isinstance(kind, str):
            raise EventError(
                "invalid_type", f"Invalid type for 'type': expected a string, but got {_type_name(kind)}.", "type"
            )
        if kind == "input_audio_buffer.append":
            self._append(event)
        elif kind in ("session.update", "transcription_session.update"):
            self._update(event, kind)
        elif kind == "input_audio_buffer.commit":
            self._commit(event)
        elif kind == "input_audio_buffer.clear":
            self._decoder.reset()
            self._buffered_ms = 0.0
            self._enqueue(_Clear())
        elif kind in _UNSUPPORTED_EVENTS:
            raise EventError("unsupported_event", f"'{kind}' is not supported in a transcription session.", "type")
        else:
            supported = ", ".join(f"'{k}'" for k in _SUPPORTED_EVENTS)
            raise EventError("invalid_value", f"Invalid value: {kind!r}. Supported values are: {supported}.", "type")

    def _enqueue(self, work: _Work) -> None:
        try:
            self._work.put_nowait(work)
        except asyncio.QueueFull:
            raise EventError("overloaded", "Too many queued client events; slow down.", kind="server_error") from None

    def _update(self, event: Mapping[str, Any], kind: str) -> None:
        if "session" not in event:
            raise EventError("missing_required_parameter", "Missing required parameter: 'session'.", "session")
        config = parse_session(_object(event["session"], "session"), self.config, self.models)
        if kind == "transcription_session.update":
            self.beta = True
        if config.input_format != self.config.input_format or config.server_vad != self.config.server_vad:
            self._decoder = InputDecoder(config.input_format)
            self._buffered_ms = 0.0
        self.config = config
        self._enqueue(_Configure(config, kind.replace(".update", ".updated")))

    def _append(self, event: Mapping[str, Any]) -> None:
        audio = event.get("audio")
        if audio is None:
            raise EventError("missing_required_parameter", "Missing required parameter: 'audio'.", "audio")
        if not isinstance(audio, str):
            raise EventError(
                "invalid_type",
                f"Invalid type for 'audio': expected a base64 string, but got {_type_name(audio)}.",
                "audio",
            )
        if len(audio) * 3 // 4 > MAX_AUDIO_BYTES_PER_EVENT + 2:
            raise EventError(
                "audio_too_large",
                f"Invalid 'audio': an append carries at most {MAX_AUDIO_BYTES_PER_EVENT} bytes of audio.",
                "audio",
            )
        try:
            data = base64.b64decode(audio, validate=True)
        except (binascii.Error, ValueError):
            raise EventError(
                "invalid_value", "Invalid 'audio': not valid base64-encoded audio bytes.", "audio"
            ) from None
        if len(data) > MAX_AUDIO_BYTES_PER_EVENT:
            raise EventError(
                "audio_too_large",
                f"Invalid 'audio': an append carries at most {MAX_AUDIO_BYTES_PER_EVENT} bytes of audio.",
                "audio",
            )
        if not data:
            return
        fmt = self.config.input_format
        duration_ms = len(data) / fmt.bytes_per_sample / fmt.rate_hz * 1000.0
        if duration_ms > MAX_BUFFER_S * 1000 or (
            not self.config.server_vad and self._buffered_ms + duration_ms > MAX_BUFFER_S * 1000
        ):
            raise EventError(
                "audio_too_large",
                f"The input audio buffer holds at most {MAX_BUFFER_S} s of audio; commit or clear it. "
                "The audio was dropped.",
                "audio",
            )
        if self._backlog_samples * 1000 / SAMPLE_RATE_HZ + duration_ms > MAX_BACKLOG_S * 1000:
            raise EventError(
                "overloaded", "The server is behind by too much audio; the audio was dropped.", kind="server_error"
            )
        samples = self._decoder.decode(data)
        if samples.size == 0:
            return
        self._enqueue(_Audio(samples))
        self._backlog_samples += samples.size
        if not self.config.server_vad:
            self._buffered_ms += duration_ms

    def _commit(self, event: Mapping[str, Any]) -> None:
        raw_id = event.get("event_id")
        client_event_id = raw_id if isinstance(raw_id, str) else None
        if not self.config.server_vad:
            if self._buffered_ms < MIN_COMMIT_MS:
                raise EventError(
                    "input_audio_buffer_commit_empty",
                    f"Error committing input audio buffer: buffer too small. Expected at least {MIN_COMMIT_MS}ms "
                    f"of audio, but buffer only has {self._buffered_ms:.2f}ms of audio.",
                )
            self._buffered_ms = 0.0
            tail = self._decoder.flush()
            if tail.size:
                self._enqueue(_Audio(tail))
                self._backlog_samples += tail.size
        self._enqueue(_Commit(client_event_id))

    # --- the worker ---------------------------------------------------------------------------------

    async def _run_worker(self) -> None:
        try:
            while True:
                work = await self._work.get()
                if isinstance(work, _Audio):
                    self._backlog_samples -= work.samples.size
                    self._fed_samples += work.samples.size
                    await self.stream.feed(work.samples)
                elif isinstance(work, _Configure):
                    await self._apply(work.config)
                    self.send_session(work.reply, work.config)
                elif isinstance(work, _Commit):
                    await self._commit_buffer(work.client_event_id)
                else:
                    self.stream.clear()
                    self._drop_speaking()
                    self.send("input_audio_buffer.cleared")
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("realtime session %s: worker failed", self.id)
            self.send_error("internal_error", "Internal server error; closing the session.", kind="server_error")
            self._spawn(self.aclose(WSCloseCode.INTERNAL_ERROR, "internal error"), "realtime-close")

    async def _apply(self, config: RealtimeConfig) -> None:
        old = self._applied
        self._applied = config
        segmenter = config.segmenter(self.settings)
        if segmenter == self._segmenter and config.server_vad == old.server_vad:
            self.stream.configure(config.stream_options(self.settings))
            return
        # Turn detection changed. A StreamSession's segmenter and mode are fixed: finish the utterance
        # being spoken, drop uncommitted manual audio, and start a new one. The old one still delivers
        # its queued finals (their items complete) and is closed with the session.
        if self.stream.options.server_vad and self.stream.in_speech:
            await self._commit_buffer(None)
        self.stream.clear()
        self._drop_speaking()
        self._retired.append(self.stream)
        if len(self._retired) > MAX_RETIRED_STREAMS:
            self._spawn(self._retired.pop(0).aclose(), "realtime-retire")
        self._segmenter = segmenter
        self.stream = self._new_stream(config)

    def _drop_speaking(self) -> None:
        """Forget the item being spoken (its audio was cleared): it will get no transcript."""
        item, self._speaking = self._speaking, None
        if item is not None:
            self._forget(item)

    def _forget(self, item: _Item) -> None:
        for start_ms, waiting in list(self._awaiting.items()):
            if waiting is item:
                del self._awaiting[start_ms]

    async def _commit_buffer(self, client_event_id: str | None) -> None:
        if self.stream.options.server_vad:
            item = self._speaking
            if item is None or not self.stream.in_speech:
                self.send_error(
                    "input_audio_buffer_commit_empty",
                    "Error committing input audio buffer: no speech in the buffer (server VAD commits by itself).",
                    client_event_id=client_event_id,
                )
                return
            await self._transcribe(item, self.stream.commit)
            return
        item = _Item(_new_id("item"))
        self._committed(item)
        final = await self._transcribe(item, self.stream.stop_recording)
        self.stream.start_recording()
        if final is not None:
            self._completed(item, final)

    async def _transcribe(
        self, item: _Item, finish: Callable[[], Awaitable[FinalTranscript | None]]
    ) -> FinalTranscript | None:
        """Run a commit (``StreamSession.commit`` / ``stop_recording``); a failure fails the item."""
        self._muted_errors += 1  # the failure is reported on the item, not as a loose error event
        try:
            return await finish()
        except ApiError as exc:
            self._forget(item)
            self._failed(item, exc.code, exc.message, "invalid_request_error" if exc.status < 500 else "server_error")
        except (DeadlineExceeded, TimeoutError):
            self._forget(item)
            self._failed(item, "timeout", "The transcription did not finish in time.")
        finally:
            self._muted_errors -= 1
        return None


# --- HTTP -----------------------------------------------------------------------------------------------


class UpgradeRequired(ApiError):
    status = 426
    code = "upgrade_required"


def _is_beta(request: web.Request) -> bool:
    header = request.headers.get("OpenAI-Beta", "").replace(" ", "").lower()
    protocols = request.headers.get("Sec-WebSocket-Protocol", "").replace(" ", "").lower().split(",")
    return "realtime=v1" in header.split(",") or "openai-beta.realtime-v1" in protocols


async def realtime_handler(request: web.Request) -> web.StreamResponse:
    """GET /v1/realtime: upgrade, register the session, read until it closes, clean up."""
    settings = request.app[SETTINGS]
    config = default_config(settings, request.app[ASR].registry, request.query)
    ws = web.WebSocketResponse(
        heartbeat=settings.ws_heartbeat_s,
        max_msg_size=max(settings.ws_max_message_bytes, MAX_FRAME_BYTES),
        protocols=("realtime",),
    )
    if not ws.can_prepare(request).ok:
        raise UpgradeRequired(
            "GET /v1/realtime is a WebSocket endpoint (the OpenAI Realtime API); upgrade the connection"
        )
    session = RealtimeSession(request.app, ws, settings, config, beta=_is_beta(request))
    request.app[SESSIONS].add(session.id, session)  # over the cap: a 503 before the upgrade
    try:
        await ws.prepare(request)
        session.start()
        log.info("realtime session %s: opened from %s (model %s)", session.id, request.remote, config.resolved_model)
        session.send_session("session.created", config)
        if session.beta:
            session.send_session("transcription_session.created", config)
        await session.run()
    finally:
        await session.aclose()
    return ws


def add_routes(app: web.Application) -> None:
    app.router.add_get(PATH, realtime_handler)
