"""Realtime conversations, parsed directly: session and response options in GA and beta shapes,
the URL's session kind, conversation items (order, context, truncation) and their errors."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from mediaserver.asr.models import ModelRegistry
from mediaserver.assistant.audio_out import Mark
from mediaserver.config import Settings
from mediaserver.errors import InvalidParameter, UnknownModel
from mediaserver.llm.types import ChatMessage
from mediaserver.transport.openai.realtime.config import InputFormat
from mediaserver.transport.openai.realtime.conversation_config import (
    AnswerDefaults,
    ConversationConfig,
    default_conversation,
    parse_conversation_session,
    parse_response_options,
)
from mediaserver.transport.openai.realtime.items import ROOT, Item, Items, parse_item
from mediaserver.transport.openai.realtime.session_update import default_config, session_kind
from mediaserver.transport.openai.realtime.values import EventError

VOICES = {"en_US-joe-medium", "alloy", "marin"}


@pytest.fixture(scope="module")
def settings(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    return Settings(_env_file=None, model_cache_dir=tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="module")
def models(settings: Settings) -> ModelRegistry:
    return ModelRegistry(settings)


@pytest.fixture
def base(settings: Settings, models: ModelRegistry) -> ConversationConfig:
    return ConversationConfig(
        input=default_config(settings, models, {}),
        model="gpt-realtime",
        llm_model=None,
        instructions="Be brief.",
        voice="en_US-joe-medium",
        answer=AnswerDefaults.of(settings, 0.2),
    )


def check_voice(name: str, param: str) -> None:
    if name not in VOICES:
        raise EventError("invalid_value", f"Invalid '{param}': unknown voice {name!r}.", param)


def is_llm(name: str) -> bool:
    return name == "smollm2"


def parse(session: dict[str, Any], base: ConversationConfig, models: ModelRegistry) -> ConversationConfig:
    return parse_conversation_session(session, base, models, check_voice=check_voice, is_llm=is_llm)


def error_of(call: Any, *args: Any, **kwargs: Any) -> EventError:
    with pytest.raises(EventError) as info:
        call(*args, **kwargs)
    return info.value


# --- which session a URL opens ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "kind", "llm"),
    [
        ({}, "conversation", None),
        ({"model": "gpt-realtime"}, "conversation", None),
        ({"model": "gpt-4o-mini-realtime-preview"}, "conversation", None),
        ({"model": "smollm2"}, "conversation", "smollm2"),
        ({"intent": "transcription"}, "transcription", None),
        ({"intent": "transcription", "model": "gpt-realtime"}, "transcription", None),
        ({"model": "gpt-4o-transcribe"}, "transcription", None),
        ({"model": "whisper-1"}, "transcription", None),
        ({"model": "base"}, "transcription", None),
    ],
)
def test_the_url_decides_the_session_kind(
    settings: Settings, models: ModelRegistry, query: dict[str, str], kind: str, llm: str | None
) -> None:
    found, config, llm_model = session_kind(settings, models, query, is_llm)
    assert (found, llm_model) == (kind, llm)
    assert config.resolved_model == (query.get("model") if query.get("model") == "base" else "tiny.en")


def test_bad_urls_are_refused(settings: Settings, models: ModelRegistry) -> None:
    with pytest.raises(InvalidParameter, match="intent must be 'transcription'"):
        session_kind(settings, models, {"intent": "conversation"}, is_llm)
    with pytest.raises(UnknownModel, match="unknown model 'nope'") as caught:  # model_not_found, as on REST
        session_kind(settings, models, {"model": "nope"}, is_llm)
    assert (caught.value.code, caught.value.param) == ("model_not_found", "model")
    with pytest.raises(UnknownModel, match="unknown model 'nope'"):  # a transcription URL's too
        session_kind(settings, models, {"intent": "transcription", "model": "nope"}, is_llm)
    # The error names both kinds of model a URL may name, the chat models too.
    both = r"tiny\.en\. A conversation's \?model= is a chat model \(smollm2-135m-instruct\)"
    with pytest.raises(UnknownModel, match=both):
        session_kind(settings, models, {"model": "nope"}, is_llm, lambda: ["smollm2-135m-instruct"])


# --- session.update ---------------------------------------------------------------------------------------


def test_ga_session(base: ConversationConfig, models: ModelRegistry, settings: Settings) -> None:
    config = parse(
        {
            "type": "realtime",
            "model": "smollm2",
            "instructions": "Talk like a pirate.",
            "output_modalities": ["text"],
            "audio": {
                "input": {
                    "format": {"type": "audio/pcmu"},
                    "turn_detection": {"type": "server_vad", "create_response": False},
                },
                "output": {"format": {"type": "audio/pcma"}, "voice": {"id": "marin"}, "speed": 1.25},
            },
            "max_output_tokens": 77,
            "tools": [{"type": "function", "name": "noop"}],
            "tool_choice": "none",
            "tracing": "auto",
            "truncation": "auto",
        },
        base,
        models,
    )
    assert (config.model, config.llm_model, config.instructions, config.modality) == (
        "smollm2",
        "smollm2",
        "Talk like a pirate.",
        "text",
    )
    assert config.input.input_format == InputFormat("audio/pcmu", 8000)
    assert config.output_format == InputFormat("audio/pcma", 8000)
    assert (config.voice, config.speed, config.max_output_tokens) == ("marin", 1.25, 77)
    turn = config.input.turn_detection
    assert turn is not None and (turn.create_response, turn.interrupt_response) == (False, True)
    described = config.describe_ga("sess_1", settings)
    assert described["type"] == "realtime" and described["output_modalities"] == ["text"]
    assert described["audio"]["output"] == {"format": {"type": "audio/pcma"}, "voice": "marin", "speed": 1.25}
    assert described["audio"]["input"]["turn_detection"]["create_response"] is False
    assert described["tools"] == [{"type": "function", "name": "noop"}] and described["tool_choice"] == "none"
    # What an update leaves out stays.
    again = parse({"instructions": "Be kind."}, config, models)
    assert (again.voice, again.modality, again.max_output_tokens) == ("marin", "text", 77)


def test_beta_session(base: ConversationConfig, models: ModelRegistry, settings: Settings) -> None:
    config = parse(
        {
            "modalities": ["audio", "text"],
            "voice": "alloy",
            "input_audio_format": "g711_alaw",
            "output_audio_format": "g711_ulaw",
            "max_response_output_tokens": "inf",
            "temperature": 0.8,
            "turn_detection": None,
        },
        base,
        models,
    )
    assert (config.modality, config.voice, config.max_output_tokens, config.temperature) == (
        "audio",
        "alloy",
        None,
        0.8,
    )
    assert config.input.turn_detection is None
    described = config.describe_beta("sess_1", settings)
    assert described["modalities"] == ["audio", "text"] and described["output_audio_format"] == "g711_ulaw"
    assert described["input_audio_format"] == "g711_alaw"
    # "inf" runs as the assistant's answer limit, and that is what the session shows.
    assert described["max_response_output_tokens"] == settings.assistant_max_answer_tokens


@pytest.mark.parametrize(
    ("session", "code", "param"),
    [
        ({"type": "transcription"}, "invalid_value", "session.type"),
        ({"model": "llama-unknown"}, "model_not_found", "session.model"),
        ({"instructions": 5}, "invalid_type", "session.instructions"),
        ({"output_modalities": []}, "invalid_value", "session.output_modalities"),
        ({"output_modalities": ["speech"]}, "invalid_value", "session.output_modalities"),
        ({"modalities": "text"}, "invalid_value", "session.modalities"),
        ({"audio": {"output": {"voice": "nobody"}}}, "invalid_value", "session.audio.output.voice"),
        ({"audio": {"output": {"voice": ""}}}, "invalid_value", "session.audio.output.voice"),
        ({"audio": {"output": {"speed": 3}}}, "invalid_value", "session.audio.output.speed"),
        ({"audio": {"output": {"voise": "alloy"}}}, "unknown_parameter", "session.audio.output.voise"),
        (
            {"audio": {"output": {"format": {"type": "audio/pcm", "rate": 44100}}}},
            "invalid_value",
            "session.audio.output.format.rate",
        ),
        ({"output_audio_format": "mp3"}, "invalid_value", "session.output_audio_format"),
        ({"max_output_tokens": 0}, "integer_below_min_value", "session.max_output_tokens"),
        ({"max_output_tokens": 5000}, "integer_above_max_value", "session.max_output_tokens"),
        ({"temperature": 3}, "invalid_value", "session.temperature"),
        ({"tools": "all"}, "invalid_type", "session.tools"),
        (
            {"tools": [{"type": "function", "name": "f", "parameters": {"type": "objekt"}}]},
            "invalid_value",
            "session.tools",
        ),
        ({"tools": [{"type": "mcp", "server_url": "http://x/mcp"}]}, "invalid_value", "session.tools[0].server_label"),
        (
            {
                "tools": [
                    {"type": "mcp", "server_label": "x", "server_url": "http://x/mcp", "require_approval": "never"}
                ]
            },
            "invalid_value",
            "session.tools[0].server_url",  # no URL is allowed without realtime_mcp_allowed_urls
        ),
        (
            {"tools": [{"type": "function", "name": "f"}], "tool_choice": {"type": "function", "name": "g"}},
            "invalid_value",
            "session.tool_choice",
        ),
        ({"turn_detection": {"create_response": "yes"}}, "invalid_type", "session.turn_detection.create_response"),
    ],
)
def test_bad_sessions(
    base: ConversationConfig, models: ModelRegistry, session: dict[str, Any], code: str, param: str
) -> None:
    error = error_of(parse, session, base, models)
    assert (error.code, error.param) == (code, param), error.message


def test_sealed_instructions_are_shown_redacted(
    base: ConversationConfig, models: ModelRegistry, settings: Settings
) -> None:
    """Instructions a client secret carried reach the LLM, never the session events; what the client
    sets itself is its own and is echoed."""
    sealed = replace(base, instructions="The secret plan.", instructions_sealed=True)
    assert sealed.describe_ga("sess_1", settings)["instructions"] == "<redacted>"
    assert sealed.describe_beta("sess_1", settings)["instructions"] == "<redacted>"
    kept = parse({"output_modalities": ["text"]}, sealed, models)
    assert kept.instructions == "The secret plan." and kept.instructions_sealed
    echoed_back = parse({"instructions": "<redacted>"}, sealed, models)  # the session as it was shown
    assert echoed_back.instructions == "The secret plan." and echoed_back.instructions_sealed
    own = parse({"instructions": "Be brief."}, sealed, models)
    assert own.describe_ga("sess_1", settings)["instructions"] == "Be brief." and not own.instructions_sealed
    assert parse({"instructions": "<redacted>"}, base, models).instructions == "<redacted>"  # nothing sealed


def test_response_options_override_the_session(base: ConversationConfig) -> None:
    assert parse_response_options(None, base, check_voice=check_voice).instructions == "Be brief."
    ga = parse_response_options(
        {
            "instructions": "Say hi.",
            "output_modalities": ["text"],
            "max_output_tokens": 20,
            "metadata": {"client_event_id": "x"},
            "conversation": "none",
            "input": [{"type": "item_reference", "id": "item_1"}],
        },
        base,
        check_voice=check_voice,
    )
    assert (ga.instructions, ga.modality, ga.max_output_tokens, ga.in_conversation) == ("Say hi.", "text", 20, False)
    assert ga.metadata == {"client_event_id": "x"} and ga.input == ({"type": "item_reference", "id": "item_1"},)
    assert ga.describe(beta=False)["output_modalities"] == ["text"]
    beta = parse_response_options(
        {"modalities": ["audio", "text"], "voice": "alloy", "output_audio_format": "g711_ulaw", "temperature": 0.6},
        base,
        check_voice=check_voice,
    )
    assert (beta.modality, beta.voice, beta.output_format.type, beta.temperature) == (
        "audio",
        "alloy",
        "audio/pcmu",
        0.6,
    )
    assert beta.describe(beta=True)["output_audio_format"] == "g711_ulaw"
    for response, param in (
        ({"conversation": "other"}, "response.conversation"),
        ({"metadata": {"k": 1}}, "response.metadata"),
        ({"input": "everything"}, "response.input"),
        ({"voice": "nobody"}, "response.voice"),
        ("speak", "response"),
    ):
        assert error_of(parse_response_options, response, base, check_voice=check_voice).param == param


# --- items -------------------------------------------------------------------------------------------------


def test_items_keep_their_order_and_make_the_context() -> None:
    items = Items(max_items=10)
    assert items.add(Item("a", "user", "input_text", "What is the sky?")) is None
    assert items.add(Item("b", "assistant", "output_audio", "Blue.")) == "a"
    assert items.add(Item("s", "system", "input_text", "Be brief."), ROOT) is None
    assert items.add(Item("c", "user", "input_audio", None), "a") == "a"
    assert items.ids() == ["s", "a", "c", "b"] and items.previous_id("b") == "c"
    assert [i.id for i in items.pending()] == ["c"]
    assert items.context() == [
        ChatMessage("system", "Be brief."),
        ChatMessage("user", "What is the sky?"),
        ChatMessage("assistant", "Blue."),
    ]  # the audio item has no transcript yet
    items.get("c").set_text("  And the grass?  ")  # type: ignore[union-attr]
    assert not items.pending() and items.context()[2] == ChatMessage("user", "And the grass?")
    assert items.delete("s") is not None and items.delete("s") is None
    assert error_of(items.check_insert, "a", None).param == "item.id"
    assert error_of(items.check_insert, None, "zzz").param == "previous_item_id"
    items.check_insert("new", ROOT)


def test_items_past_the_cap_forget_the_oldest() -> None:
    items = Items(max_items=3)
    for n in range(5):
        assert items.add(Item(f"i{n}", "user", "input_text", str(n))) == (f"i{n - 1}" if n else None)
    assert items.ids() == ["i2", "i3", "i4"] and "i0" not in items
    # An insertion reports the item before it even when the oldest item made room for it.
    assert items.add(Item("mid", "user", "input_text", "x"), "i3") == "i3"
    assert items.ids() == ["i3", "mid", "i4"]
    # At the start of a full conversation an item is the oldest one: forgotten at once.
    assert items.add(Item("early", "user", "input_text", "x"), ROOT) is None and "early" not in items


def test_truncation_keeps_the_words_played() -> None:
    # 1 s per sentence at 1000 Hz; the second sentence cut halfway through.
    marks = (Mark("One two three four.", 0, 1000), Mark("Five six seven eight.", 1000, 2000))
    item = Item("b", "assistant", "output_audio", "One two three four. Five six seven eight.", rate_hz=1000)
    item.audio_samples, item.marks = 2000, marks
    assert item.audio_ms == 2000
    item.truncate(1500)
    assert (item.text, item.audio_ms, item.status) == ("One two three four. Five six", 1500, "incomplete")
    assert item.describe(beta=False)["content"] == [
        {"type": "output_audio", "transcript": "One two three four. Five six"}
    ]
    assert item.describe(beta=True)["content"][0]["type"] == "audio"
    item.truncate(0)
    assert item.text == "" and item.audio_ms == 0


def test_new_items() -> None:
    text = parse_item(
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]}, max_audio_bytes=10
    )
    assert (text.role, text.kind, text.text, text.audio) == ("user", "input_text", "Hi", None)
    audio = parse_item(
        {"id": "mine", "type": "message", "role": "user", "content": [{"type": "input_audio", "audio": "AAAA"}]},
        max_audio_bytes=10,
    )
    assert (audio.id, audio.kind, audio.audio) == ("mine", "input_audio", b"\x00\x00\x00")
    beta = parse_item({"role": "assistant", "content": [{"type": "text", "text": "Sure."}]}, max_audio_bytes=10)
    assert (beta.kind, beta.text) == ("output_text", "Sure.")
    system = parse_item({"role": "system", "content": [{"type": "input_text", "text": "Be brief."}]}, max_audio_bytes=0)
    assert (system.role, system.kind) == ("system", "input_text")


@pytest.mark.parametrize(
    ("item", "code", "param"),
    [
        ("hello", "invalid_type", "item"),
        ({"type": "image"}, "invalid_value", "item.type"),
        ({"type": "function_call_output", "output": "{}"}, "missing_required_parameter", "item.call_id"),
        ({"type": "function_call_output", "call_id": 3, "output": "{}"}, "invalid_type", "item.call_id"),
        ({"type": "function_call", "call_id": "c"}, "missing_required_parameter", "item.name"),
        ({"role": "robot", "content": [{"type": "input_text", "text": "x"}]}, "invalid_value", "item.role"),
        ({"role": "user", "content": []}, "invalid_value", "item.content"),
        ({"role": "user", "content": [{"type": "input_text", "text": 3}]}, "invalid_type", "item.content[0].text"),
        (
            {"role": "user", "content": [{"type": "input_image", "image_url": "x"}]},
            "invalid_value",
            "item.content[0].type",
        ),
        (
            {"role": "assistant", "content": [{"type": "output_audio", "audio": "AAAA"}]},
            "invalid_value",
            "item.content[0].type",
        ),
        (
            {"role": "user", "content": [{"type": "input_audio", "audio": "@@"}]},
            "invalid_value",
            "item.content[0].audio",
        ),
        (
            {"role": "user", "content": [{"type": "input_audio", "audio": "A" * 40}]},
            "audio_too_large",
            "item.content[0].audio",
        ),
        ({"id": "", "role": "user", "content": [{"type": "input_text", "text": "x"}]}, "invalid_value", "item.id"),
    ],
)
def test_bad_items(item: object, code: str, param: str) -> None:
    error = error_of(parse_item, item, max_audio_bytes=10)
    assert (error.code, error.param) == (code, param), error.message


# --- echoes: what runs, and sending the echo back changes nothing ------------------------------------


@pytest.mark.parametrize(
    "update",
    [
        {},
        {"max_output_tokens": 77, "audio": {"input": {"turn_detection": {"type": "semantic_vad"}}}},
        {"max_output_tokens": "inf", "output_modalities": ["text"]},
        {"max_output_tokens": 4096},  # past llm_max_completion_tokens: runs, and shows, the cap
    ],
)
def test_the_ga_echo_round_trip_changes_nothing(
    base: ConversationConfig, models: ModelRegistry, settings: Settings, update: dict[str, Any]
) -> None:
    config = parse({"type": "realtime", **update}, base, models)
    echo = config.describe_ga("sess_1", settings)
    again = parse(echo, base, models)
    assert again.describe_ga("sess_1", settings) == echo
    before, after = (
        parse_response_options(None, config, check_voice=check_voice),
        parse_response_options(None, again, check_voice=check_voice),
    )
    assert (after.max_tokens, after.llm_temperature) == (before.max_tokens, before.llm_temperature)
    assert again.input.segmenter(settings) == config.input.segmenter(settings)


@pytest.mark.parametrize("update", [{}, {"temperature": 0.9, "max_response_output_tokens": 50}])
def test_the_beta_echo_round_trip_changes_nothing(
    base: ConversationConfig, models: ModelRegistry, settings: Settings, update: dict[str, Any]
) -> None:
    config = parse(update, base, models)
    echo = config.describe_beta("sess_1", settings)
    again = parse(echo, base, models)
    assert again.describe_beta("sess_1", settings) == echo
    before, after = (parse_response_options(None, c, check_voice=check_voice) for c in (config, again))
    assert (after.max_tokens, after.llm_temperature) == (before.max_tokens, before.llm_temperature)


def test_the_echo_shows_the_answer_limits_that_run(
    base: ConversationConfig, models: ModelRegistry, tmp_path: Any
) -> None:
    settings = Settings(
        _env_file=None,
        model_cache_dir=tmp_path,
        assistant_max_answer_tokens=90,
        llm_max_completion_tokens=300,
        assistant_temperature=0.4,
    )
    answer = AnswerDefaults.of(settings, 0.2)
    assert (answer.temperature, answer.tokens(None), answer.tokens(4096), answer.tokens(50)) == (0.4, 90, 300, 50)
    # Without assistant_temperature the model's own default runs (0.2 for the bundled SmolLM2).
    assert AnswerDefaults.of(Settings(_env_file=None, model_cache_dir=tmp_path), 0.2).temperature == 0.2
    config = replace(base, answer=answer)
    beta = config.describe_beta("sess_1", settings)
    assert (beta["temperature"], beta["max_response_output_tokens"]) == (0.4, 90)
    assert config.describe_ga("sess_1", settings)["max_output_tokens"] == 90
    options = parse_response_options({"max_output_tokens": 1000, "temperature": 1.1}, config, check_voice=check_voice)
    assert (options.max_tokens, options.llm_temperature) == (300, 1.1)
    shown = options.describe(beta=True)
    assert (shown["max_output_tokens"], shown["temperature"]) == (300, 1.1)
    assert options.describe(beta=False)["max_output_tokens"] == 300
    # A newly named LLM brings its own defaults.
    named = parse_conversation_session(
        {"model": "smollm2"},
        config,
        models,
        check_voice=check_voice,
        is_llm=is_llm,
        answer_of=lambda name: AnswerDefaults(0.7, 90, 300) if name == "smollm2" else answer,
    )
    assert named.llm_model == "smollm2" and named.describe_beta("sess_1", settings)["temperature"] == 0.7


def test_a_new_conversation_takes_the_voice_loops_settings(models: ModelRegistry) -> None:
    def new(**overrides: Any) -> ConversationConfig:
        settings = Settings(_env_file=None, **overrides)
        return default_conversation(
            settings, default_config(settings, models, {}), None, None, lambda _: AnswerDefaults.of(settings, 0.2)
        )

    default = new()
    assert (default.voice, default.modality) == ("en_US-joe-medium", "audio")
    assert new(tts_default_voice="en_GB-alba-medium").voice == "en_GB-alba-medium"
    assert new(tts_default_voice="en_GB-alba-medium", assistant_voice="en_US-amy-low").voice == "en_US-amy-low"
    assert new(assistant_speak=False).modality == "text"
