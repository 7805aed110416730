"""Realtime session configuration: ``session.update`` (GA nested and beta flat shapes) → a typed
``RealtimeConfig``, or an ``EventError`` naming the parameter in OpenAI's words.

Pure functions over plain JSON values and the model registry: no socket, no session, so every
shape and error text is unit-tested directly (tests/unit/test_realtime_config.py).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final, Literal

from mediaserver.asr.models import ModelRegistry
from mediaserver.asr.vocabulary import prompt_problem
from mediaserver.audio.decode import PcmFormat
from mediaserver.audio.echo import EchoMode, echo_mode
from mediaserver.audio.segmenter import SegmenterConfig
from mediaserver.audio.stream_decode import G711_RATE_HZ, G711StreamDecoder, PcmStreamDecoder, StreamDecoder
from mediaserver.config import Settings
from mediaserver.errors import InvalidParameter, UnknownModel
from mediaserver.events import TranscriptionOptions
from mediaserver.languages import normalize_language
from mediaserver.stream.options import StreamOptions, segmenter_config

MAX_VAD_MS: Final = 10000
MIN_SILENCE_MS: Final = 60  # two 30 ms VAD frames: the shortest hangover the segmenter runs
MAX_IDLE_TIMEOUT_MS: Final = 10 * 60 * 1000

AudioType = Literal["audio/pcm", "audio/pcmu", "audio/pcma"]
TurnType = Literal["server_vad", "semantic_vad"]
_AUDIO_TYPES: Final[tuple[AudioType, ...]] = ("audio/pcm", "audio/pcmu", "audio/pcma")
_BETA_FORMATS: Final[dict[str, AudioType]] = {
    "pcm16": "audio/pcm",
    "g711_ulaw": "audio/pcmu",
    "g711_alaw": "audio/pcma",
}
_PCM_RATES_HZ: Final = (24000, 16000)
_EAGERNESS: Final = ("low", "medium", "high", "auto")
_EAGERNESS_SILENCE_MS: Final = {"low": 1000, "high": 300}
_EAGERNESS_LEVELS: Final[tuple[Literal["low", "medium", "high", "auto"], ...]] = ("low", "medium", "high", "auto")


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:22]}"


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

    def decoder(self) -> StreamDecoder:
        """A decoder for appended audio; a PCM16 append of an odd byte count keeps it for the next."""
        if self.is_pcm:
            return PcmStreamDecoder(PcmFormat(self.rate_hz, 16, 1), carry_partial=True)
        return G711StreamDecoder("ulaw" if self.type == "audio/pcmu" else "alaw")

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

    def stream_options(self, settings: Settings) -> StreamOptions:
        transcription = TranscriptionOptions(
            language=self.language,
            beam_size=settings.default_beam_size,
            initial_prompt=self.prompt or None,
            with_segment_timestamps=False,
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


def type_name(value: object) -> str:
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


def as_object(value: object, param: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise EventError(
            "invalid_type", f"Invalid type for '{param}': expected an object, but got {type_name(value)}.", param
        )
    return value


def as_bool(value: object, param: str) -> bool:
    if not isinstance(value, bool):
        raise EventError(
            "invalid_type", f"Invalid type for '{param}': expected a boolean, but got {type_name(value)}.", param
        )
    return value


def _optional_str(value: object, param: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise EventError(
        "invalid_type", f"Invalid type for '{param}': expected a string, but got {type_name(value)}.", param
    )


def number(value: object, param: str, minimum: float, maximum: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise EventError(
            "invalid_type", f"Invalid type for '{param}': expected a number, but got {type_name(value)}.", param
        )
    if not minimum <= value <= maximum:
        raise EventError(
            "invalid_value", f"Invalid '{param}': {value}. Expected a value from {minimum} to {maximum}.", param
        )
    return float(value)


def integer(value: object, param: str, minimum: int, maximum: int) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise EventError(
            "invalid_type", f"Invalid type for '{param}': expected an integer, but got {type_name(value)}.", param
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
        return InputFormat(kind, 24000 if kind == "audio/pcm" else G711_RATE_HZ)
    spec = as_object(value, param)
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
        rate = 24000 if raw_rate is None else integer(raw_rate, f"{param}.rate", 1, 1_000_000)
        if rate not in _PCM_RATES_HZ:
            raise EventError(
                "invalid_value",
                f"Invalid '{param}.rate': {rate}. Supported values are: 24000 (and 16000, an extension of this "
                "server).",
                f"{param}.rate",
            )
        return InputFormat(kind, rate)
    if raw_rate is not None and integer(raw_rate, f"{param}.rate", 1, 1_000_000) != G711_RATE_HZ:
        raise EventError(
            "invalid_value", f"Invalid '{param}.rate': {raw_rate}. G.711 audio is 8000 Hz.", f"{param}.rate"
        )
    return InputFormat(kind, G711_RATE_HZ)


def parse_turn_detection(value: object, param: str) -> TurnDetection | None:
    if value is None:
        return None
    spec = as_object(value, param)
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
        threshold=None if threshold is None else number(threshold, f"{param}.threshold", 0.0, 1.0),
        prefix_padding_ms=None
        if prefix_ms is None
        else integer(prefix_ms, f"{param}.prefix_padding_ms", 0, MAX_VAD_MS),
        silence_duration_ms=(
            None if silence_ms is None else integer(silence_ms, f"{param}.silence_duration_ms", 0, MAX_VAD_MS)
        ),
        eagerness=eagerness if kind == "semantic_vad" else None,
        create_response=_flag(spec, "create_response", param),
        interrupt_response=_flag(spec, "interrupt_response", param),
        idle_timeout_ms=_idle_timeout_ms(spec.get("idle_timeout_ms"), f"{param}.idle_timeout_ms"),
    )


def _idle_timeout_ms(value: object, param: str) -> int | None:
    """``idle_timeout_ms``: null (off) or a whole number of milliseconds, at most MAX_IDLE_TIMEOUT_MS."""
    return None if value is None else integer(value, param, 1, MAX_IDLE_TIMEOUT_MS)


def parse_noise_reduction(value: object, param: str) -> str | None:
    """``null`` (off) or ``{"type": "near_field" | "far_field"}``."""
    if value is None:
        return None
    raw_type = as_object(value, param).get("type")
    if raw_type not in ("near_field", "far_field"):
        raise EventError(
            "invalid_value",
            f"Invalid '{param}.type': {raw_type!r}. Supported values are: 'near_field' and 'far_field'.",
            f"{param}.type",
        )
    return str(raw_type)


def parse_echo_cancellation(value: object, param: str) -> EchoMode:
    """``"auto"`` (or null), ``"on"`` / ``"off"`` (or a boolean): this server's extension."""
    mode = echo_mode(value)
    if mode is None:
        raise EventError(
            "invalid_value",
            f"Invalid '{param}': {value!r}. Supported values are: 'auto', 'on', 'off' (or a boolean).",
            param,
        )
    return mode


def _flag(spec: Mapping[str, Any], key: str, param: str) -> bool:
    value = spec.get(key)
    return True if value is None else as_bool(value, f"{param}.{key}")


def _language(value: object, param: str) -> str | None:
    text = _optional_str(value, param)
    try:
        return normalize_language(text)
    except ValueError:
        raise EventError(
            "invalid_value", f"Invalid '{param}': {text!r} is not a supported language (ISO-639-1, e.g. 'en').", param
        ) from None


def is_openai_name(name: str | None) -> bool:
    """OpenAI's model names (``gpt-...``, ``whisper-...``), which name no model of ours."""
    return name is not None and name.strip().lower().startswith(("gpt-", "whisper-"))


def names_our_model(requested: str | None) -> bool:
    """Whether a client's model name names one of ours (not empty, not an OpenAI name)."""
    return bool(requested and requested.strip()) and not is_openai_name(requested)


def with_fallback(models: ModelRegistry, model: str, resolved: str, language: str | None) -> tuple[str, str]:
    """(the model echoed, the model that runs) for a session whose client named no model of ours:
    a language the English-only default cannot do takes the multilingual fallback
    (``translation_model``), echoed as what runs unless the client gave an OpenAI name (echoed back
    as given)."""
    fallback = models.resolve(models.for_options(None, TranscriptionOptions(language=language)))
    if fallback != resolved and not is_openai_name(model):
        model = fallback
    return model, fallback


def resolve_model(models: ModelRegistry, requested: str | None, param: str) -> str:
    """The registry name for a model; OpenAI's model names (``gpt-...``, ``whisper-...``) mean the default."""
    try:
        return models.resolve(requested)
    except UnknownModel as exc:
        if is_openai_name(requested):
            return models.resolve(None)
        raise EventError("model_not_found", exc.message, param) from None


def parse_session(session: Mapping[str, Any], base: RealtimeConfig, models: ModelRegistry) -> RealtimeConfig:
    """Apply a transcription ``session`` object (GA nested or beta flat shape) to ``base``; all or nothing."""
    session_type = session.get("type")
    if session_type is not None and session_type != "transcription":
        raise EventError(
            "invalid_value",
            f"Invalid 'session.type': {session_type!r}. This connection only runs transcription sessions "
            "(session.type = 'transcription'); a conversation (session.type = 'realtime') is a connection "
            "without ?intent=transcription.",
            "session.type",
        )
    return parse_input(session, base, models)


def parse_input(session: Mapping[str, Any], base: RealtimeConfig, models: ModelRegistry) -> RealtimeConfig:
    """The input side of a ``session`` object (format, transcription, turn detection), which
    transcription and conversation sessions share; all or nothing."""
    fmt = base.input_format
    turn = base.turn_detection
    model, language, prompt = base.model, base.language, base.prompt
    named = base.model_named
    model_param = "session.audio.input.transcription.model"

    def transcription(value: object, param: str) -> None:
        nonlocal model, language, prompt, model_param, named
        if value is None:
            return  # OpenAI turns transcription off; a transcription session keeps its settings
        spec = as_object(value, param)
        if "model" in spec:
            requested = _optional_str(spec["model"], f"{param}.model")
            model = requested.strip() if requested and requested.strip() else models.resolve(None)
            named = names_our_model(requested)
            model_param = f"{param}.model"
        if "language" in spec:
            language = _language(spec["language"], f"{param}.language")
        elif isinstance(spec.get("languages"), list):
            candidates = [_language(v, f"{param}.languages") for v in spec["languages"]]
            language = candidates[0] if len(candidates) == 1 else None
        if "prompt" in spec:
            prompt = _optional_str(spec["prompt"], f"{param}.prompt")
            if (problem := prompt_problem(prompt, models.settings)) is not None:
                raise EventError("string_above_max_length", f"Invalid '{param}.prompt': {problem}.", f"{param}.prompt")

    # Beta flat shape.
    if "input_audio_format" in session:
        fmt = parse_format(session["input_audio_format"], "session.input_audio_format")
    if "input_audio_transcription" in session:
        transcription(session["input_audio_transcription"], "session.input_audio_transcription")
    if "turn_detection" in session:
        turn = parse_turn_detection(session["turn_detection"], "session.turn_detection")
    noise = base.noise_reduction
    if "input_audio_noise_reduction" in session:
        noise = parse_noise_reduction(session["input_audio_noise_reduction"], "session.input_audio_noise_reduction")
    echo = base.echo_cancellation
    if "input_audio_echo_cancellation" in session:
        echo = parse_echo_cancellation(
            session["input_audio_echo_cancellation"], "session.input_audio_echo_cancellation"
        )
    # GA nested shape.
    if "audio" in session:
        audio = as_object(session["audio"], "session.audio")
        if "input" in audio:
            audio_input = as_object(audio["input"], "session.audio.input")
            if "format" in audio_input:
                fmt = parse_format(audio_input["format"], "session.audio.input.format")
            if "transcription" in audio_input:
                transcription(audio_input["transcription"], "session.audio.input.transcription")
            if "turn_detection" in audio_input:
                turn = parse_turn_detection(audio_input["turn_detection"], "session.audio.input.turn_detection")
            if "noise_reduction" in audio_input:
                noise = parse_noise_reduction(audio_input["noise_reduction"], "session.audio.input.noise_reduction")
            if "echo_cancellation" in audio_input:
                echo = parse_echo_cancellation(
                    audio_input["echo_cancellation"], "session.audio.input.echo_cancellation"
                )
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
    if not named:
        model, resolved = with_fallback(models, model, resolved, language)
    try:
        models.check_options(resolved, TranscriptionOptions(language=language))
    except InvalidParameter as exc:
        param = model_param.rsplit(".", 1)[0] + ".language"
        raise EventError("invalid_value", f"Invalid '{param}': {exc.message}.", param) from None
    return RealtimeConfig(model, resolved, fmt, language, prompt, turn, include, noise, echo, named)


def default_config(settings: Settings, models: ModelRegistry, query: Mapping[str, str]) -> RealtimeConfig:
    """The configuration of a new session: server defaults, and a ``?model=`` the registry knows.

    OpenAI's realtime (conversation) model names in the URL (``gpt-realtime`` ...) mean the default
    transcription model; other unknown names are a 400 before the upgrade.
    """
    intent = query.get("intent", "").strip()
    if intent not in ("", "transcription"):
        raise InvalidParameter(f"intent must be 'transcription' (got {intent!r})", param="intent")
    requested = query.get("model", "").strip()
    model = settings.asr_default_model
    if requested:
        try:
            models.resolve(requested)
            model = requested
        except UnknownModel:
            try:
                resolve_model(models, requested, "model")
            except EventError as exc:
                if exc.code == "model_not_found":
                    raise UnknownModel(exc.message, param="model") from None
                raise InvalidParameter(exc.message, param="model") from None
    resolved = resolve_model(models, model, "model")
    language = settings.default_language or None
    if not names_our_model(requested):
        model, resolved = with_fallback(models, model, resolved, language)
    return RealtimeConfig(
        model,
        resolved,
        language=language,
        model_named=names_our_model(requested),
        echo_cancellation=settings.echo_cancellation_default,
    )


SessionKind = Literal["transcription", "conversation"]


def session_kind(
    settings: Settings,
    models: ModelRegistry,
    query: Mapping[str, str],
    is_llm: Callable[[str], bool],
    llm_names: Callable[[], list[str]] = list,
) -> tuple[SessionKind, RealtimeConfig, str | None]:
    """What ``GET /v1/realtime?...`` opens: a transcription or a conversation session, the input
    configuration, and for a conversation the LLM the URL named (None: the assistant's default).

    ``intent=transcription`` is a transcription session. Otherwise ``model`` decides: a speech
    recognition model or alias (``tiny.en``, ``whisper-1``, ``gpt-4o-transcribe`` ...) keeps opening a
    transcription session, as beta clients do; no model, a chat model the LLM registry knows, or any
    other OpenAI name (``gpt-realtime``, ``gpt-4o-realtime-preview`` ...) opens a conversation.
    Anything else is a 400 before the upgrade, naming both kinds of model (``llm_names``: the chat
    models).
    """
    intent = query.get("intent", "").strip()
    requested = query.get("model", "").strip()
    if intent or not requested:
        config = default_config(settings, models, query)  # refuses other intents
        return ("transcription" if intent else "conversation"), config, None
    try:
        models.resolve(requested)
        return "transcription", default_config(settings, models, query), None
    except UnknownModel:
        pass
    without_model = {k: v for k, v in query.items() if k != "model"}
    if is_llm(requested):
        return "conversation", default_config(settings, models, without_model), requested
    if requested.lower().startswith("gpt-"):
        return "conversation", default_config(settings, models, without_model), None
    try:
        return "transcription", default_config(settings, models, query), None  # whisper-*, or a 400
    except (InvalidParameter, UnknownModel) as exc:
        chat = ", ".join(llm_names()) or "none"
        raise UnknownModel(  # (model_not_found, as every other face answers a model it does not have)
            f"{exc.message.rstrip('.')}. A conversation's ?model= is a chat model ({chat}) or an OpenAI name "
            "(gpt-...).",
            param="model",
        ) from None
