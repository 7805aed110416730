"""``session.update`` (GA nested and beta flat shapes) and the ``/v1/realtime`` URL's query → a typed
``RealtimeConfig`` (config.py), or an ``EventError`` naming the parameter in OpenAI's words.

Pure functions over plain JSON values and the model registry: no socket, no session, so every
shape and error text is unit-tested directly (tests/unit/test_realtime_config.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final, Literal

from mediaserver.asr.models import ModelRegistry
from mediaserver.asr.vocabulary import prompt_problem
from mediaserver.audio.echo import EchoMode, echo_mode
from mediaserver.audio.stream_decode import G711_RATE_HZ
from mediaserver.config import Settings
from mediaserver.errors import InvalidParameter, UnknownModel
from mediaserver.events import TranscriptionOptions
from mediaserver.languages import normalize_language
from mediaserver.transport.openai.realtime.config import (
    BETA_FORMATS,
    LOGPROBS_INCLUDE,
    AudioType,
    InputFormat,
    RealtimeConfig,
    TurnDetection,
    TurnType,
)
from mediaserver.transport.openai.realtime.values import (
    EventError,
    as_bool,
    as_object,
    integer,
    known_fields,
    number,
    optional_str,
)

MAX_VAD_MS: Final = 10000
MAX_IDLE_TIMEOUT_MS: Final = 10 * 60 * 1000
_AUDIO_TYPES: Final[tuple[AudioType, ...]] = ("audio/pcm", "audio/pcmu", "audio/pcma")
_PCM_RATES_HZ: Final = (24000, 16000)
_EAGERNESS: Final = ("low", "medium", "high", "auto")
# The fields OpenAI defines for each small object of a session (what session.created echoes, too).
TURN_DETECTION_FIELDS: Final = frozenset(
    {
        "type",
        "threshold",
        "prefix_padding_ms",
        "silence_duration_ms",
        "eagerness",
        "create_response",
        "interrupt_response",
        "idle_timeout_ms",
    }
)
AUDIO_INPUT_FIELDS: Final = frozenset(
    {"format", "transcription", "turn_detection", "noise_reduction", "echo_cancellation"}
)
TRANSCRIPTION_FIELDS: Final = frozenset({"model", "language", "languages", "prompt"})
FORMAT_FIELDS: Final = frozenset({"type", "rate"})
NOISE_REDUCTION_FIELDS: Final = frozenset({"type"})


def parse_format(value: object, param: str) -> InputFormat:
    if isinstance(value, str):  # beta: "pcm16" | "g711_ulaw" | "g711_alaw"
        kind = BETA_FORMATS.get(value)
        if kind is None:
            raise EventError(
                "invalid_value",
                f"Invalid '{param}': {value!r}. Supported values are: 'pcm16', 'g711_ulaw' and 'g711_alaw'.",
                param,
            )
        return InputFormat(kind, 24000 if kind == "audio/pcm" else G711_RATE_HZ)
    spec = known_fields(value, FORMAT_FIELDS, param)
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
    spec = known_fields(value, TURN_DETECTION_FIELDS, param)
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
    raw_type = known_fields(value, NOISE_REDUCTION_FIELDS, param).get("type")
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
    text = optional_str(value, param)
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
        spec = known_fields(value, TRANSCRIPTION_FIELDS, param)
        if "model" in spec:
            requested = optional_str(spec["model"], f"{param}.model")
            model = requested.strip() if requested and requested.strip() else models.resolve(None)
            named = names_our_model(requested)
            model_param = f"{param}.model"
        if "language" in spec:
            language = _language(spec["language"], f"{param}.language")
        elif isinstance(spec.get("languages"), list):
            candidates = [_language(v, f"{param}.languages") for v in spec["languages"]]
            language = candidates[0] if len(candidates) == 1 else None
        if "prompt" in spec:
            prompt = optional_str(spec["prompt"], f"{param}.prompt")
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
            audio_input = known_fields(audio["input"], AUDIO_INPUT_FIELDS, "session.audio.input")
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
        for index, value in enumerate(raw_include or ()):
            if value != LOGPROBS_INCLUDE:  # (OpenAI's one value: an unknown one was taken and did nothing)
                raise EventError(
                    "invalid_value",
                    f"Invalid 'session.include[{index}]': {value!r}. Supported values are: '{LOGPROBS_INCLUDE}'.",
                    f"session.include[{index}]",
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
