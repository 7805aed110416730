"""The vocabulary Whisper is given (asr/vocabulary.py): how the server's ``asr_vocabulary`` and a
session's prompt combine, and the one bound (``asr_max_prompt_chars``) every face checks, with the
error each face gives past it. The real model's side is tests/integration/test_vocabulary.py."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from mediaserver.asr.models import ModelRegistry
from mediaserver.asr.vocabulary import check_prompt, merged, prompt_problem, with_vocabulary
from mediaserver.config import Settings
from mediaserver.errors import InvalidParameter
from mediaserver.events import TranscriptionOptions
from mediaserver.transport.common import stream_options_from
from mediaserver.transport.openai.realtime.session_update import default_config, parse_session
from mediaserver.transport.openai.realtime.values import EventError
from mediaserver.transport.ws.start import parse_start
from mediaserver.transport.wyoming.stt import transcribe_prompt


@pytest.fixture(scope="module")
def settings(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    return Settings(_env_file=None, model_cache_dir=tmp_path_factory.mktemp("models"))


def narrow(settings: Settings, **update: Any) -> Settings:
    """``settings`` at a non-default bound (and vocabulary), validated as the server would."""
    return Settings(**(settings.model_dump() | {"asr_max_prompt_chars": 40} | update))


def test_the_defaults_are_no_vocabulary_and_600_characters(settings: Settings) -> None:
    assert settings.asr_vocabulary == "" and settings.asr_max_prompt_chars == 600
    assert check_prompt("x" * 600, settings, "prompt") == "x" * 600
    with pytest.raises(InvalidParameter, match="600 \\(asr_max_prompt_chars\\)"):
        check_prompt("x" * 601, settings, "prompt")


def test_the_vocabulary_comes_first_and_the_sessions_prompt_nearest_the_audio() -> None:
    assert merged("Gregson, Kubernetes", "ill-disposed") == "Gregson, Kubernetes ill-disposed"
    assert merged("Gregson", None) == "Gregson" and merged("", "Kaffee") == "Kaffee"
    assert merged("  ", "  ") is None
    options = TranscriptionOptions(initial_prompt="Kaffee")
    assert with_vocabulary(options, "") is options
    assert with_vocabulary(options, "Gregson").initial_prompt == "Gregson Kaffee"
    assert with_vocabulary(TranscriptionOptions(), "Gregson").initial_prompt == "Gregson"


def test_the_bound_holds_the_vocabulary_and_the_prompt_together(settings: Settings) -> None:
    alone = narrow(settings)
    assert check_prompt("x" * 40, alone, "prompt") == "x" * 40
    assert prompt_problem("x" * 41, alone) == "the prompt is 41 characters; it may be at most 40 (asr_max_prompt_chars)"
    beside = narrow(settings, asr_vocabulary="Gregson, Kubernetes")  # 19 characters: 21 left
    assert check_prompt("x" * 21, beside, "prompt") == "x" * 21
    with pytest.raises(InvalidParameter) as info:
        check_prompt("x" * 22, beside, "prompt")
    assert info.value.param == "prompt" and info.value.status == 400
    assert info.value.message == (
        "prompt too long: the prompt is 22 characters; beside the server's vocabulary (asr_vocabulary, "
        "19 characters) it may be at most 21 (asr_max_prompt_chars = 40)"
    )
    assert check_prompt(None, beside, "prompt") is None and check_prompt("", beside, "prompt") is None
    with pytest.raises(InvalidParameter, match="prompt must be a string"):
        check_prompt(["Gregson"], beside, "prompt")


def test_a_vocabulary_longer_than_the_bound_stops_the_server_at_start(settings: Settings) -> None:
    with pytest.raises(ValidationError, match="asr_vocabulary is 41 characters, longer than asr_max_prompt_chars"):
        narrow(settings, asr_vocabulary="x" * 41)
    assert narrow(settings, asr_vocabulary="  Gregson  ").asr_vocabulary == "Gregson"  # stripped


def test_the_device_websocket_and_webrtc_refuse_a_prompt_too_long(settings: Settings) -> None:
    """``start`` of the device WebSocket and ``start.obj`` / ``stop.obj`` / the offer's query of
    WebRTC: both are ``stream_options_from``; the error names ``prompt``."""
    tight = narrow(settings, asr_vocabulary="Gregson")  # 33 characters left
    config = parse_start({"prompt": "x" * 33}, tight, ModelRegistry(tight))
    assert config.options.transcription.initial_prompt == "x" * 33
    assert config.describe()["prompt"] == "x" * 33  # ready echoes the session's own prompt
    for values in ({"prompt": "x" * 34}, {"type": "start", "prompt": "x" * 34, "hands_free": True}):
        with pytest.raises(InvalidParameter, match="at most 33") as info:
            stream_options_from(values, tight)
        assert info.value.param == "prompt"
    with pytest.raises(InvalidParameter, match="at most 33"):
        parse_start({"prompt": "x" * 34}, tight, ModelRegistry(tight))


def test_realtime_refuses_a_prompt_too_long_in_openais_shape(settings: Settings) -> None:
    tight = narrow(settings)
    models = ModelRegistry(tight)
    base = default_config(tight, models, {})
    ok = parse_session({"audio": {"input": {"transcription": {"prompt": "x" * 40}}}}, base, models)
    assert ok.prompt == "x" * 40
    for session, param in (
        ({"audio": {"input": {"transcription": {"prompt": "x" * 41}}}}, "session.audio.input.transcription.prompt"),
        ({"input_audio_transcription": {"prompt": "x" * 41}}, "session.input_audio_transcription.prompt"),
    ):
        with pytest.raises(EventError) as info:
            parse_session(session, base, models)
        assert (info.value.code, info.value.param) == ("string_above_max_length", param)
        assert info.value.message == (
            f"Invalid '{param}': the prompt is 41 characters; it may be at most 40 (asr_max_prompt_chars)."
        )


def test_wyoming_names_and_terms_are_the_prompt_names_last(settings: Settings) -> None:
    assert transcribe_prompt({}, settings) is None
    assert transcribe_prompt({"transcript_names": None, "transcript_terms": []}, settings) is None
    assert transcribe_prompt({"transcript_names": ["Gregson", " "]}, settings) == "Gregson"
    both = {"transcript_names": ["Gregson", "Siobhan"], "transcript_terms": ["ill-disposed"], "context": {"x": 1}}
    assert transcribe_prompt(both, settings) == "ill-disposed, Gregson, Siobhan"
    for bad in ("Gregson", ["Gregson", 7], {"name": "Gregson"}):
        with pytest.raises(InvalidParameter, match="transcribe transcript_names must be a list of strings"):
            transcribe_prompt({"transcript_names": bad}, settings)


def test_wyoming_refuses_names_and_terms_too_long(settings: Settings) -> None:
    tight = narrow(settings)
    assert transcribe_prompt({"transcript_names": ["x" * 18, "y" * 20]}, tight) == "x" * 18 + ", " + "y" * 20
    with pytest.raises(InvalidParameter) as info:
        transcribe_prompt({"transcript_names": ["x" * 20], "transcript_terms": ["y" * 20]}, tight)
    assert info.value.message == (
        "transcribe transcript_terms and transcript_names too long: the prompt is 42 characters; it may be at "
        "most 40 (asr_max_prompt_chars)"
    )
