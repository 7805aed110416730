"""The device WebSocket's start message (or query string), parsed directly."""

from __future__ import annotations

from typing import Any

import pytest

from mediaserver.asr.models import ModelRegistry
from mediaserver.audio.decode import PcmFormat
from mediaserver.config import Settings
from mediaserver.errors import ApiError, InvalidParameter, UnknownModel
from mediaserver.transport.ws.start import StreamConfig, parse_start


@pytest.fixture(scope="module")
def settings(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    return Settings(_env_file=None, model_cache_dir=tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="module")
def models(settings: Settings) -> ModelRegistry:
    return ModelRegistry(settings)


def start(settings: Settings, models: ModelRegistry, base: StreamConfig | None = None, **values: Any) -> StreamConfig:
    return parse_start(values, settings, models, base)


def test_defaults(settings: Settings, models: ModelRegistry) -> None:
    config = start(settings, models)
    assert (config.sample_rate_hz, config.encoding, config.channels, config.mode) == (16000, "pcm16", 1, "server_vad")
    assert not config.partials and not config.segments
    assert config.options.model == "tiny.en"
    assert config.options.transcription.language == settings.default_language
    assert config.pcm_format == PcmFormat(16000, 16, 1)
    options = config.stream_options()
    assert options.server_vad and not options.partials


def test_every_field(settings: Settings, models: ModelRegistry) -> None:
    config = start(
        settings,
        models,
        sample_rate=48000,
        encoding="f32le",
        channels=2,
        mode="push_to_talk",
        partials=True,
        segments="true",
        language="de",
        model="base",
        beam_size=4,
        task="translate",
        prompt="Kaffee",
    )
    assert config.pcm_format == PcmFormat(48000, 32, 2, is_float=True)
    assert config.mode == "push_to_talk" and not config.stream_options().server_vad
    assert config.partials and config.segments
    t = config.options.transcription
    assert (t.language, t.beam_size, t.task, t.initial_prompt) == ("de", 4, "translate", "Kaffee")
    described = config.describe()
    assert described["encoding"] == "float32" and described["model"] == "base" and described["task"] == "translate"
    assert config.stream_options().transcription.with_segment_timestamps


@pytest.mark.parametrize("name", ["pcm16", "int16", "S16LE", "float32", "f32le"])
def test_encoding_names(settings: Settings, models: ModelRegistry, name: str) -> None:
    assert start(settings, models, encoding=name).encoding in ("pcm16", "float32")


def test_language_null_asks_for_detection(settings: Settings, models: ModelRegistry) -> None:
    assert start(settings, models, model="base", language=None).options.transcription.language is None
    assert start(settings, models, model="base", language="").options.transcription.language is None


def test_a_second_start_keeps_what_it_does_not_say(settings: Settings, models: ModelRegistry) -> None:
    first = start(settings, models, sample_rate=8000, mode="push_to_talk", partials=True, model="base")
    second = start(settings, models, first, language="fr")
    assert (second.sample_rate_hz, second.mode, second.partials, second.options.model) == (
        8000,
        "push_to_talk",
        True,
        "base",
    )
    assert second.options.transcription.language == "fr"


def test_without_a_model_each_start_picks_the_model_for_its_language(settings: Settings, models: ModelRegistry) -> None:
    """No model named: a language the English-only default cannot do takes translation_model, afresh
    at each start (a review: a second start inherited the first's model as if named, and English then
    German was refused). A model named once is kept, and refuses what it cannot do."""
    english = start(settings, models, language="en")
    german = start(settings, models, english, language="de")
    assert (english.options.model, german.options.model) == ("tiny.en", "base")
    assert start(settings, models, german, language="en").options.model == "tiny.en"
    named = start(settings, models, model="tiny.en")
    with pytest.raises(InvalidParameter):
        start(settings, models, named, language="de")


@pytest.mark.parametrize(
    ("values", "error", "param"),
    [
        ({"encoding": "mp3"}, InvalidParameter, "encoding"),
        ({"encoding": 16}, InvalidParameter, "encoding"),
        ({"sample_rate": 4000}, InvalidParameter, "sample_rate"),
        ({"sample_rate": "fast"}, InvalidParameter, "sample_rate"),
        ({"channels": 3}, InvalidParameter, "channels"),
        ({"mode": "always"}, InvalidParameter, "mode"),
        ({"partials": "maybe"}, InvalidParameter, "partials"),
        ({"beam_size": 0}, InvalidParameter, "beam_size"),
        ({"task": "summarize"}, InvalidParameter, "task"),
        ({"language": "klingon"}, InvalidParameter, "language"),
        ({"model": "tiny.en", "language": "de"}, InvalidParameter, "language"),  # tiny.en is English-only
        ({"model": "tiny.en", "task": "translate"}, InvalidParameter, "model"),  # so is translation
        ({"model": "nope"}, UnknownModel, "model"),
    ],
)
def test_bad_values_name_their_parameter(
    settings: Settings, models: ModelRegistry, values: dict[str, Any], error: type[ApiError], param: str
) -> None:
    with pytest.raises(error) as info:
        parse_start(values, settings, models)
    assert info.value.param == param
    assert info.value.status == 400


def test_turn_detection_and_eagerness(settings: Settings, models: ModelRegistry) -> None:
    """Semantic turns per session (the OpenAI names too); a later start keeps them; bad values name
    their parameter."""
    config = start(settings, models, turn_detection="semantic_vad", eagerness="high")
    options = config.stream_options()
    assert (options.turn_detection, options.eagerness) == ("semantic", "high")
    assert config.describe()["turn_detection"] == "semantic"
    again = start(settings, models, base=config, partials=True).stream_options()
    assert (again.turn_detection, again.eagerness) == ("semantic", "high")
    assert start(settings, models, base=config, turn_detection="silence").stream_options().turn_detection == "silence"
    assert start(settings, models).stream_options().turn_detection is None  # the server's setting decides
    for key, value in (("turn_detection", "smart"), ("eagerness", "eager")):
        with pytest.raises(InvalidParameter) as raised:
            parse_start({key: value}, settings, models, None)
        assert raised.value.param == key


SET_COLOR = {
    "type": "function",
    "name": "set_color",
    "description": "Set the colour of the lamp.",
    "parameters": {"type": "object", "properties": {"color": {"type": "string"}}, "required": ["color"]},
}


def test_client_tools_come_with_the_assistant_and_are_kept_until_replaced(
    settings: Settings, models: ModelRegistry
) -> None:
    config = start(settings, models, assistant=True, tools=[SET_COLOR], tool_choice="required")
    assert [spec.name for spec in config.client_tools.specs] == ["set_color"]
    assert config.client_tools.choice is not None and config.client_tools.choice[0] == "required"
    assert config.describe()["tools"] == ["set_color"]
    again = start(settings, models, config, system_prompt="Be brief.")  # neither key: kept
    assert again.client_tools == config.client_tools
    choice_only = start(settings, models, config, tools=[SET_COLOR])  # tools alone: the choice is the server's
    assert choice_only.client_tools.choice is None and len(choice_only.client_tools.specs) == 1
    auto = start(settings, models, config, tool_choice="auto")  # a new choice among the same tools
    assert auto.client_tools.specs == config.client_tools.specs and auto.client_tools.choice == ("auto", False)
    cleared = start(settings, models, config, tools=[])
    assert cleared.client_tools.specs == () and "tools" not in cleared.describe()
    off = start(settings, models, config, assistant=False)  # no assistant: no tools to call
    assert off.client_tools.specs == ()
    assert "tools" not in start(settings, models).describe()


@pytest.mark.parametrize(
    ("values", "param", "text"),
    [
        ({"assistant": True, "tools": "set_color"}, "tools", "'tools' must be a list"),
        ({"assistant": True, "tools": [{**SET_COLOR, "name": "set color"}]}, "tools", "letters, digits"),
        ({"assistant": True, "tools": [SET_COLOR], "tool_choice": {"type": "function", "name": "x"}}, None, "not in"),
        ({"assistant": True, "tool_choice": "required"}, None, "the request has no tools"),
        ({"tools": [SET_COLOR]}, "tools", "'tools' needs 'assistant': true"),
    ],
)
def test_bad_client_tools_name_their_parameter(
    settings: Settings, models: ModelRegistry, values: dict[str, Any], param: str | None, text: str
) -> None:
    with pytest.raises(InvalidParameter) as err:
        start(settings, models, **values)
    assert text in err.value.message
    if param is not None:
        assert err.value.param == param
    else:
        assert err.value.param in ("tools", "tool_choice")


@pytest.mark.parametrize(
    ("values", "cancelling"),
    [
        ({}, False),
        ({"assistant": True}, True),  # echo_cancellation_default auto: on with the voice loop (docs/echo.md)
        ({"assistant": True, "echo_cancellation": "auto"}, True),  # auto: on with the voice loop
        ({"echo_cancellation": "auto"}, False),  # auto, and the server does not speak
        ({"assistant": True, "echo_cancellation": "off"}, False),
        ({"assistant": True, "echo_cancellation": False}, False),
        ({"echo_cancellation": "on"}, True),
        ({"echo_cancellation": True}, True),
    ],
)
def test_echo_cancellation_is_on_where_the_server_speaks(
    settings: Settings, models: ModelRegistry, values: dict[str, Any], cancelling: bool
) -> None:
    config = start(settings, models, **values)
    assert config.echo_cancelling is cancelling and config.describe()["echo_cancellation"] is cancelling
    again = start(settings, models, config, partials=True)  # a later start without it keeps it
    assert again.echo_cancelling is cancelling


def test_the_server_default_of_echo_cancellation(models: ModelRegistry, tmp_path: Any) -> None:
    settings = Settings(_env_file=None, model_cache_dir=tmp_path, echo_cancellation_default="off")
    config = start(settings, models, assistant=True)
    assert not config.echo_cancelling and config.echo_cancellation == "off"
    assert start(settings, models, assistant=True, echo_cancellation="auto").echo_cancelling


def test_a_bad_echo_cancellation_is_refused(settings: Settings, models: ModelRegistry) -> None:
    with pytest.raises(InvalidParameter, match="echo_cancellation"):
        start(settings, models, echo_cancellation="loud")
