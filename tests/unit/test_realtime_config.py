"""Realtime session configuration, parsed directly: GA and beta shapes, and every error text."""

from __future__ import annotations

from typing import Any

import pytest

from mediaserver.asr.models import ModelRegistry
from mediaserver.config import Settings
from mediaserver.errors import InvalidParameter, UnknownModel
from mediaserver.transport.openai.realtime.config import InputFormat, RealtimeConfig, TurnDetection
from mediaserver.transport.openai.realtime.session_update import (
    default_config,
    parse_format,
    parse_session,
    parse_turn_detection,
)
from mediaserver.transport.openai.realtime.values import EventError


@pytest.fixture(scope="module")
def settings(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    return Settings(_env_file=None, model_cache_dir=tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="module")
def models(settings: Settings) -> ModelRegistry:
    return ModelRegistry(settings)


@pytest.fixture
def base(settings: Settings, models: ModelRegistry) -> RealtimeConfig:
    return default_config(settings, models, {})


def error_of(call: Any, *args: Any) -> EventError:
    with pytest.raises(EventError) as info:
        call(*args)
    return info.value


# --- formats ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("pcm16", InputFormat("audio/pcm", 24000)),
        ("g711_ulaw", InputFormat("audio/pcmu", 8000)),
        ("g711_alaw", InputFormat("audio/pcma", 8000)),
        ({"type": "audio/pcm"}, InputFormat("audio/pcm", 24000)),
        ({"type": "audio/pcm", "rate": 16000}, InputFormat("audio/pcm", 16000)),
        ({"type": "audio/pcm", "rate": 24000.0}, InputFormat("audio/pcm", 24000)),
        ({"type": "audio/pcmu"}, InputFormat("audio/pcmu", 8000)),
        ({"type": "audio/pcma", "rate": 8000}, InputFormat("audio/pcma", 8000)),
        ({}, InputFormat("audio/pcm", 24000)),
    ],
)
def test_formats_in_both_shapes(value: object, expected: InputFormat) -> None:
    assert parse_format(value, "f") == expected


@pytest.mark.parametrize(
    ("value", "code", "param", "text"),
    [
        (
            "mp3",
            "invalid_value",
            "f",
            "Invalid 'f': 'mp3'. Supported values are: 'pcm16', 'g711_ulaw' and 'g711_alaw'.",
        ),
        ({"type": "audio/opus"}, "invalid_value", "f.type", "Supported values are: 'audio/pcm', 'audio/pcmu'"),
        ({"type": "audio/pcm", "rate": 44100}, "invalid_value", "f.rate", "Invalid 'f.rate': 44100. Supported"),
        ({"type": "audio/pcm", "rate": "fast"}, "invalid_type", "f.rate", "expected an integer, but got a string"),
        ({"type": "audio/pcm", "rate": 0}, "integer_below_min_value", "f.rate", "Minimum is 1."),
        ({"type": "audio/pcmu", "rate": 16000}, "invalid_value", "f.rate", "G.711 audio is 8000 Hz."),
        (42, "invalid_type", "f", "Invalid type for 'f': expected an object, but got a number."),
        ([], "invalid_type", "f", "expected an object, but got an array."),
    ],
)
def test_bad_formats(value: object, code: str, param: str, text: str) -> None:
    error = error_of(parse_format, value, "f")
    assert (error.code, error.param) == (code, param)
    assert text in error.message


def test_format_descriptions_round_trip() -> None:
    assert InputFormat("audio/pcm", 24000).beta() == "pcm16"
    assert InputFormat("audio/pcm", 16000).beta() == {"type": "audio/pcm", "rate": 16000}
    assert InputFormat("audio/pcmu", 8000).ga() == {"type": "audio/pcmu"}
    for fmt in (InputFormat("audio/pcm", 24000), InputFormat("audio/pcma", 8000)):
        assert parse_format(fmt.beta(), "f") == fmt
        assert parse_format(fmt.ga(), "f") == fmt


# --- turn detection -------------------------------------------------------------------------------


def test_turn_detection_shapes(settings: Settings) -> None:
    assert parse_turn_detection(None, "t") is None
    assert parse_turn_detection({}, "t") == TurnDetection()
    turn = parse_turn_detection(
        {"type": "server_vad", "threshold": 0.8, "prefix_padding_ms": 200, "silence_duration_ms": 700}, "t"
    )
    assert turn == TurnDetection("server_vad", 0.8, 200, 700)
    segmenter = turn.segmenter(settings)
    assert (segmenter.aggressiveness, segmenter.preroll_ms, segmenter.hangover_ms) == (3, 200, 700)
    assert segmenter.min_speech_ms == 0  # every start of speech becomes an item, as with OpenAI
    semantic = parse_turn_detection({"type": "semantic_vad", "eagerness": "low"}, "t")
    assert semantic == TurnDetection("semantic_vad", eagerness="low")
    assert semantic.segmenter(settings).hangover_ms == 1000
    kept = TurnDetection().segmenter(settings)
    assert kept.hangover_ms == settings.stream_vad_hangover_ms  # fields left out keep the settings


@pytest.mark.parametrize(
    ("value", "code", "param"),
    [
        ({"type": "push_to_talk"}, "invalid_value", "t.type"),
        ({"threshold": 1.5}, "invalid_value", "t.threshold"),
        ({"threshold": "high"}, "invalid_type", "t.threshold"),
        ({"threshold": True}, "invalid_type", "t.threshold"),
        ({"prefix_padding_ms": -1}, "integer_below_min_value", "t.prefix_padding_ms"),
        ({"silence_duration_ms": 10001}, "integer_above_max_value", "t.silence_duration_ms"),
        ({"silence_duration_ms": 1.5}, "invalid_type", "t.silence_duration_ms"),
        ({"type": "semantic_vad", "eagerness": "eager"}, "invalid_value", "t.eagerness"),
        ("server_vad", "invalid_type", "t"),
    ],
)
def test_bad_turn_detection(value: object, code: str, param: str) -> None:
    error = error_of(parse_turn_detection, value, "t")
    assert (error.code, error.param) == (code, param)
    assert param in error.message


# --- whole sessions -----------------------------------------------------------------------------


def test_ga_nested_shape(base: RealtimeConfig, models: ModelRegistry) -> None:
    config = parse_session(
        {
            "type": "transcription",
            "audio": {
                "input": {
                    "format": {"type": "audio/pcm", "rate": 16000},
                    "transcription": {"model": "base", "language": "de", "prompt": "Kaffee"},
                    "turn_detection": None,
                }
            },
            "include": ["item.input_audio_transcription.logprobs"],
        },
        base,
        models,
    )
    assert config.input_format == InputFormat("audio/pcm", 16000)
    assert (config.model, config.resolved_model, config.language, config.prompt) == ("base", "base", "de", "Kaffee")
    assert config.turn_detection is None and not config.server_vad
    assert config.include == ("item.input_audio_transcription.logprobs",)


def test_beta_flat_shape(base: RealtimeConfig, models: ModelRegistry) -> None:
    config = parse_session(
        {
            "input_audio_format": "g711_ulaw",
            "input_audio_transcription": {"model": "gpt-4o-transcribe", "language": "en"},
            "turn_detection": {"type": "server_vad", "silence_duration_ms": 300},
        },
        base,
        models,
    )
    assert config.input_format == InputFormat("audio/pcmu", 8000)
    assert config.model == "gpt-4o-transcribe" and config.resolved_model == "tiny.en"  # OpenAI names: the default
    assert config.turn_detection == TurnDetection(silence_duration_ms=300)


def test_an_update_keeps_what_it_does_not_mention(base: RealtimeConfig, models: ModelRegistry) -> None:
    first = parse_session({"audio": {"input": {"transcription": {"prompt": "hello"}}}}, base, models)
    second = parse_session({"audio": {"input": {"turn_detection": None}}}, first, models)
    assert second.prompt == "hello" and second.turn_detection is None
    assert second.input_format == base.input_format
    # transcription: null keeps a transcription session's settings
    assert parse_session({"input_audio_transcription": None}, first, models).prompt == "hello"
    # one language in "languages" is that language; several mean detection
    assert parse_session({"audio": {"input": {"transcription": {"languages": ["en"]}}}}, base, models).language == "en"
    several = parse_session({"audio": {"input": {"transcription": {"languages": ["en", "de"]}}}}, base, models)
    assert several.language is None


@pytest.mark.parametrize(
    ("session", "code", "param", "text"),
    [
        ({"type": "realtime"}, "invalid_value", "session.type", "only runs transcription sessions"),
        ({"audio": "pcm"}, "invalid_type", "session.audio", "expected an object, but got a string."),
        (
            {"audio": {"input": {"transcription": {"language": "xx"}}}},
            "invalid_value",
            "session.audio.input.transcription.language",
            "'xx' is not a supported language",
        ),
        (
            {"audio": {"input": {"transcription": {"model": "tiny.en", "language": "de"}}}},
            "invalid_value",
            "session.audio.input.transcription.language",
            "model 'tiny.en' is English-only; language 'de' needs a multilingual model",
        ),
        (
            {"audio": {"input": {"transcription": {"model": "no-such-model"}}}},
            "model_not_found",
            "session.audio.input.transcription.model",
            "unknown model 'no-such-model'",
        ),
        (
            {"input_audio_transcription": {"prompt": 7}},
            "invalid_type",
            "session.input_audio_transcription.prompt",
            "expected a string, but got a number.",
        ),
        ({"include": "logprobs"}, "invalid_type", "session.include", "expected an array of strings."),
        # An unknown value asked for nothing the server gives (a bad-input trial: it was taken silently).
        (
            {"include": ["item.input_audio_transcription.logprobs", "bogus"]},
            "invalid_value",
            "session.include[1]",
            "Supported values are: 'item.input_audio_transcription.logprobs'.",
        ),
        # A typo in one of the small objects OpenAI fixed is refused, as OpenAI does (it was taken
        # silently, and server VAD stayed on: a Realtime trial).
        (
            {"audio": {"input": {"turn_detecton": None}}},
            "unknown_parameter",
            "session.audio.input.turn_detecton",
            "Unknown parameter: 'session.audio.input.turn_detecton'.",
        ),
        (
            {"audio": {"input": {"turn_detection": {"type": "server_vad", "silence_ms": 900}}}},
            "unknown_parameter",
            "session.audio.input.turn_detection.silence_ms",
            "Unknown parameter",
        ),
        (
            {"turn_detection": {"type": "semantic_vad", "eagernes": "low"}},
            "unknown_parameter",
            "session.turn_detection.eagernes",
            "Unknown parameter",
        ),
        (
            {"audio": {"input": {"transcription": {"modle": "base"}}}},
            "unknown_parameter",
            "session.audio.input.transcription.modle",
            "Unknown parameter",
        ),
        (
            {"audio": {"input": {"format": {"type": "audio/pcm", "sample_rate": 16000}}}},
            "unknown_parameter",
            "session.audio.input.format.sample_rate",
            "Unknown parameter",
        ),
    ],
)
def test_bad_sessions(
    base: RealtimeConfig, models: ModelRegistry, session: dict[str, Any], code: str, param: str, text: str
) -> None:
    error = error_of(parse_session, session, base, models)
    assert (error.code, error.param) == (code, param)
    assert text in error.message


def test_another_language_with_an_openai_model_name_takes_the_multilingual_fallback(
    base: RealtimeConfig, models: ModelRegistry
) -> None:
    """OpenAI's names (or none) with a language tiny.en cannot transcribe: translation_model (base)."""
    for model in (None, "gpt-4o-transcribe", "whisper-1"):
        transcription: dict[str, object] = {"language": "de"} if model is None else {"model": model, "language": "de"}
        config = parse_session({"audio": {"input": {"transcription": transcription}}}, base, models)
        assert config.resolved_model == "base", (model, config)
    english = parse_session({"audio": {"input": {"transcription": {"language": "en"}}}}, base, models)
    assert english.resolved_model == "tiny.en"


def test_an_invalid_update_changes_nothing(base: RealtimeConfig, models: ModelRegistry) -> None:
    session = {"input_audio_format": "g711_alaw", "turn_detection": {"threshold": 9}}
    error_of(parse_session, session, base, models)
    assert base.input_format == InputFormat()  # frozen: nothing half-applied


def test_default_config_from_the_url(settings: Settings, models: ModelRegistry) -> None:
    assert default_config(settings, models, {}).resolved_model == "tiny.en"
    assert default_config(settings, models, {"model": "base"}).resolved_model == "base"
    assert default_config(settings, models, {"model": "gpt-realtime"}).resolved_model == "tiny.en"
    # A server whose default language the English-only default cannot do: the multilingual fallback
    # from the first session.created (a review: every utterance was refused until a session.update).
    german = settings.model_copy(update={"default_language": "de"})
    assert (default_config(german, models, {}).model, default_config(german, models, {}).resolved_model) == (
        "base",
        "base",
    )
    assert default_config(german, models, {"model": "gpt-realtime"}).resolved_model == "base"
    assert default_config(settings, models, {"intent": "transcription"}).model == settings.asr_default_model
    with pytest.raises(InvalidParameter, match="intent must be 'transcription'"):
        default_config(settings, models, {"intent": "conversation"})
    with pytest.raises(UnknownModel, match="unknown model 'nope'"):  # model_not_found, as on REST
        default_config(settings, models, {"model": "nope"})


def test_descriptions_in_both_shapes(base: RealtimeConfig, settings: Settings) -> None:
    ga = base.describe_ga("sess_1", settings)
    assert ga["type"] == "transcription" and ga["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 24000}
    assert ga["audio"]["input"]["turn_detection"]["silence_duration_ms"] == settings.stream_vad_hangover_ms
    beta = base.describe_beta("sess_1", settings)
    assert beta["input_audio_format"] == "pcm16" and beta["modalities"] == ["text"]
    assert beta["input_audio_transcription"]["model"] == settings.asr_default_model


# --- noise reduction ----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["near_field", "far_field"])
def test_noise_reduction_is_parsed_and_echoed(
    base: RealtimeConfig, models: ModelRegistry, settings: Settings, kind: str
) -> None:
    from mediaserver.audio.noise import realtime_level

    ga = parse_session({"audio": {"input": {"noise_reduction": {"type": kind}}}}, base, models)
    beta = parse_session({"input_audio_noise_reduction": {"type": kind}}, base, models)
    assert ga.noise_reduction == beta.noise_reduction == kind
    assert ga.describe_ga("s", settings)["audio"]["input"]["noise_reduction"] == {"type": kind}
    assert beta.describe_beta("s", settings)["input_audio_noise_reduction"] == {"type": kind}
    expected = settings.noise_near_field_level if kind == "near_field" else settings.noise_far_field_level
    assert realtime_level(kind, settings) == expected > 0
    assert parse_session({"input_audio_noise_reduction": None}, ga, models).noise_reduction is None
    assert parse_session({"turn_detection": None}, ga, models).noise_reduction == kind  # kept when not named


def test_bad_noise_reduction_is_an_error(base: RealtimeConfig, models: ModelRegistry) -> None:
    error = error_of(parse_session, {"input_audio_noise_reduction": {"type": "studio"}}, base, models)
    assert error.code == "invalid_value" and error.param == "session.input_audio_noise_reduction.type"
    error = error_of(parse_session, {"audio": {"input": {"noise_reduction": "far"}}}, base, models)
    assert error.code == "invalid_type"


# --- echoes: what runs, and sending the echo back changes nothing --------------------------------

TURN_DETECTIONS: list[dict[str, Any] | None] = [
    {},
    {"type": "server_vad", "threshold": 0.6, "silence_duration_ms": 30, "prefix_padding_ms": 120},
    {"type": "server_vad", "threshold": 1.0},
    {"type": "server_vad", "threshold": 0.0, "silence_duration_ms": 900},
    {"type": "semantic_vad"},
    {"type": "semantic_vad", "eagerness": "low"},
    {"type": "semantic_vad", "eagerness": "high", "threshold": 0.3},
    {"type": "semantic_vad", "eagerness": "medium", "silence_duration_ms": 750},
    None,
]


@pytest.mark.parametrize("turn_detection", TURN_DETECTIONS)
@pytest.mark.parametrize("shape", ["ga", "beta"])
@pytest.mark.parametrize(
    "overrides",
    [{}, {"stream_vad_aggressiveness": 1, "stream_vad_hangover_ms": 800, "realtime_prefix_padding_ms": 150}],
)
def test_the_echo_round_trip_changes_nothing(
    turn_detection: dict[str, Any] | None, shape: str, overrides: dict[str, Any], tmp_path: Any
) -> None:
    """A client that sends ``session.updated`` back as its next ``session.update`` (the OpenAI SDKs'
    habit) keeps the segmenter it has, and is shown the same session again."""
    settings = Settings(_env_file=None, model_cache_dir=tmp_path, **overrides)
    models = ModelRegistry(settings)
    start = default_config(settings, models, {})
    update = (
        {"audio": {"input": {"turn_detection": turn_detection}}}
        if shape == "ga"
        else {"turn_detection": turn_detection}
    )
    config = parse_session(update, start, models)
    describe = config.describe_ga if shape == "ga" else config.describe_beta
    echo = describe("sess_1", settings)
    again = parse_session(echo, start, models)  # onto the defaults: the echo alone says it all
    assert again.segmenter(settings) == config.segmenter(settings)
    assert again.stream_options(settings) == config.stream_options(settings)
    assert (again.describe_ga if shape == "ga" else again.describe_beta)("sess_1", settings) == echo


def test_the_echo_shows_what_runs(base: RealtimeConfig, models: ModelRegistry, tmp_path: Any) -> None:
    settings = Settings(
        _env_file=None, model_cache_dir=tmp_path, stream_vad_aggressiveness=1, stream_vad_hangover_ms=800
    )
    shown = base.describe_ga("sess_1", settings)["audio"]["input"]["turn_detection"]
    segmenter = base.segmenter(settings)
    # threshold is the level of the aggressiveness in force; silence is the hangover that runs.
    assert (shown["threshold"], segmenter.aggressiveness) == (0.25, 1)
    assert shown["silence_duration_ms"] == segmenter.hangover_ms == 800
    # A threshold runs as the level it falls in; a silence below two VAD frames runs as 60 ms.
    config = parse_session({"turn_detection": {"threshold": 0.6, "silence_duration_ms": 10}}, base, models)
    shown = config.describe_beta("sess_1", settings)["turn_detection"]
    assert (shown["threshold"], config.segmenter(settings).aggressiveness) == (0.5, 2)
    assert shown["silence_duration_ms"] == config.segmenter(settings).hangover_ms == 60
    # semantic_vad shows no silence OpenAI's shape lacks unless the client set one.
    for eagerness, hangover in (("low", 1000), ("high", 300)):
        config = parse_session({"turn_detection": {"type": "semantic_vad", "eagerness": eagerness}}, base, models)
        shown = config.describe_ga("sess_1", settings)["audio"]["input"]["turn_detection"]
        assert "silence_duration_ms" not in shown and shown["eagerness"] == eagerness
        assert config.segmenter(settings).hangover_ms == hangover  # without the turn model
    # A session does not expire: no made-up expires_at.
    assert "expires_at" not in base.describe_ga("sess_1", settings)


# --- echo cancellation (this server's extension) ------------------------------------------------


@pytest.mark.parametrize(
    ("value", "mode"), [("on", "on"), (True, "on"), ("auto", "auto"), (None, "auto"), ("off", "off")]
)
def test_echo_cancellation_is_parsed_and_echoed(
    base: RealtimeConfig, models: ModelRegistry, settings: Settings, value: object, mode: str
) -> None:
    assert base.echo_cancellation == "auto"  # the default (echo_cancellation_default)
    ga = parse_session({"audio": {"input": {"echo_cancellation": value}}}, base, models)
    beta = parse_session({"input_audio_echo_cancellation": value}, base, models)
    assert ga.echo_cancellation == beta.echo_cancellation == mode
    assert ga.describe_ga("s", settings)["audio"]["input"]["echo_cancellation"] == mode
    assert beta.describe_beta("s", settings)["input_audio_echo_cancellation"] == mode
    assert parse_session({"turn_detection": None}, ga, models).echo_cancellation == mode  # kept when not named
    assert parse_session(ga.describe_ga("s", settings), base, models).echo_cancellation == mode  # round trip


def test_bad_echo_cancellation_is_an_error(base: RealtimeConfig, models: ModelRegistry) -> None:
    error = error_of(parse_session, {"input_audio_echo_cancellation": "loud"}, base, models)
    assert error.code == "invalid_value" and error.param == "session.input_audio_echo_cancellation"
    error = error_of(parse_session, {"audio": {"input": {"echo_cancellation": 1}}}, base, models)
    assert error.param == "session.audio.input.echo_cancellation" and "'auto', 'on', 'off'" in error.message


def test_the_server_default_of_echo_cancellation(models: ModelRegistry, tmp_path: Any) -> None:
    settings = Settings(_env_file=None, model_cache_dir=tmp_path, echo_cancellation_default="off")
    assert default_config(settings, models, {}).echo_cancellation == "off"
